"""The seam between an SDK method and the engine: one :class:`Translator` per method.

A translator reads an SDK call's keyword arguments into an :class:`~.call.SdkCall`
(the engine's item and what it shares with calls like it), or declines and the call
goes to the real client untouched; then turns the engine's :class:`Answer` back into
that SDK's own object, and an engine error into what the SDK itself would raise.
:mod:`coalesce._wrap.registry` says which translator serves which method; the client
only follows that table, so a new SDK method is a new translator and one table entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .._observe.listeners import UsageShare
from .call import SdkCall

__all__ = ["Answer", "Translator"]


@dataclass(frozen=True)
class Answer:
    """The engine's answer to one coalesced call.

    Attributes:
        value: The item's validated output (text, or the schema's JSON value).
        call: The call, as its translator read it.
        share: Its usage share and the packed reply's metadata; its ``finished`` event
            is set once the share is final (the group's reply is done, re-asks
            included): a streamed reply waits for it before its last event.
    """

    value: Any
    call: SdkCall
    share: UsageShare


class Translator(Protocol):
    """Translates one SDK method (``chat.completions.create``, ``messages.parse``, ...).

    Translators subclass it to inherit :meth:`error`'s default. ``given`` is always the call's keyword arguments without the SDK's "not given"
    sentinels and without coalesce's own headers.
    """

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        """The call as the engine takes it, or ``None`` to pass it through untouched.

        Pure: no I/O; it may import the SDK to derive what the SDK itself would send.
        """
        ...

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        """The SDK's own return value for the caller (an object, or a stream of events)."""
        ...

    def error(self, error: Exception, given: Mapping[str, Any]) -> Exception:
        """What the caller sees for ``error`` raised while answering: by default
        ``error`` itself; a translator whose SDK method raises its own exception in
        that case returns that one (the caller gets it with ``error`` as its cause)."""
        return error

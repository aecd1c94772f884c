"""What a coalescible SDK call is, read from its keyword arguments: an :class:`SdkCall`.

The pieces both SDKs share live here: the last user message is the item, earlier
turns of plain text (a string, or a list of text parts) become the shared
instructions, the caller's output cap and ``stream=``, and the arguments that steer
how a call is sent rather than what it answers (:func:`split_transport`:
``extra_headers``, empty ``extra_body`` / ``extra_query``, ``timeout``). Each
translator (``openai_chat``, ``anthropic_messages``, ...) reads its own method's
arguments with them. Nothing here does I/O or imports an SDK.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "JSON_OBJECT",
    "TASK",
    "TRANSPORT_ARGUMENTS",
    "SdkCall",
    "Transport",
    "converted",
    "given_arguments",
    "instructions",
    "json_object_call",
    "last_user",
    "new_call",
    "output_cap",
    "split_transport",
    "stream_flag",
    "streamed",
    "turns",
]

#: What each item is asked, after the caller's own system text.
TASK = "Each item's input is one user message; its output is your reply to that message."

#: OpenAI's ``response_format`` (chat) of a call whose answer is any JSON object.
JSON_OBJECT = {"type": "json_object"}


@dataclass(frozen=True)
class SdkCall:
    """One SDK call that can be coalesced: the engine's item and what it shares.

    Attributes:
        key: Canonical JSON of everything but the item: calls with equal keys share
            a prompt (and an engine).
        model: The model.
        instructions: The shared instructions (system text and earlier turns).
        item: The last user message's text: the item.
        output_schema: JSON schema of the answer, or ``None`` for plain text.
        options: Sampling options sent with the packed request.
        item_cap: The caller's own output-token cap, if any.
        tool: The forced tool whose arguments are the answer, if any (the caller
            gets a tool call of its own).
        stream: The call asked for a stream (``stream=True``).
        include_usage: OpenAI's ``stream_options={"include_usage": True}``.
        timeout: The caller's own ``timeout=`` in seconds, if given (``None``: none);
            not part of the key, since calls with different limits may share a request.
        prompted: The reply's format is asked in the prompt, not by a reply schema: a
            ``json_object`` call (:func:`json_object_call`), whose packed request
            spells the reply's frame out in the system message and is sent with the
            caller's own ``response_format`` (in :attr:`options`).
    """

    key: str
    model: str
    instructions: str
    item: str
    output_schema: Mapping[str, Any] | None
    options: Mapping[str, Any] = field(default_factory=dict)
    item_cap: int | None = None
    tool: str | None = None
    stream: bool = False
    include_usage: bool = False
    timeout: float | None = None
    prompted: bool = False


def given_arguments(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the SDKs' "not given" sentinels (``NOT_GIVEN``, ``omit``).

    Args:
        kwargs: Keyword arguments of an SDK method.
    """
    return {k: v for k, v in kwargs.items() if type(v).__name__ not in ("NotGiven", "Omit")}


#: A call's key as ``json.dumps`` writes it with these options; one encoder for all.
_KEY = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)


def _canonical(value: Any) -> str:
    return _KEY.encode(value)


def new_call(
    model: str,
    instructions: str,
    item: str,
    schema: Mapping[str, Any] | None,
    options: Mapping[str, Any],
    cap: int | None,
    tool: str | None = None,
    timeout: float | None = None,
) -> SdkCall:
    """The :class:`SdkCall` of these parts, keyed by all of them but the item and the
    caller's ``timeout``."""
    key = _canonical([model, instructions, schema, dict(options), cap, tool])
    return SdkCall(key, model, instructions, item, schema, options, cap, tool, timeout=timeout)


def json_object_call(
    model: str,
    instructions: str,
    item: str,
    options: Mapping[str, Any],
    cap: int | None,
    timeout: float | None = None,
) -> SdkCall:
    """The :class:`SdkCall` of a ``json_object`` call: its answer is any JSON object,
    checked as one (an answer that is not is asked again, alone if need be).

    OpenAI's ``json_object`` mode holds a reply to JSON, not to a schema: the packed
    request is sent with the same ``response_format`` (the server that took the
    caller's call takes it), and the frame of the reply (an object of results keyed by
    id) is spelled out in the system message, as for a provider without structured
    output. The schema the caller's own instructions spell out, if any, stays in them.
    Such calls share requests only with ``json_object`` calls (the format is part of
    the key).
    """
    options = {**options, "response_format": dict(JSON_OBJECT)}
    call = new_call(model, instructions, item, {"type": "object"}, options, cap, None, timeout)
    return dataclasses.replace(call, prompted=True)


def streamed(call: SdkCall, stream: bool, include_usage: bool) -> SdkCall:
    """``call`` for a streamed call: its own key, so streamed calls share requests."""
    if not stream:
        return call
    return dataclasses.replace(
        call, key=call.key + ":stream", stream=True, include_usage=include_usage
    )


def _text(content: Any) -> str | None:
    """A message's content when it is plain text, else ``None``: a string, or a
    non-empty list of text parts (``{"type": "text", "text": ...}``, nothing else in
    them), joined as :func:`instructions` joins system texts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    texts = [_text_part(part) for part in content]
    if any(text is None for text in texts):
        return None
    return "\n\n".join(text for text in texts if text is not None)


def _text_part(part: Any) -> str | None:
    if not isinstance(part, Mapping) or set(part) != {"type", "text"}:
        return None
    text = part["text"]
    return text if part["type"] == "text" and isinstance(text, str) else None


def turns(
    messages: Sequence[Any], system_roles: frozenset[str]
) -> tuple[list[str], list[str]] | None:
    """(system texts, rendered earlier turns), or ``None`` when a turn is not plain text."""
    system: list[str] = []
    rendered: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping) or set(message) - {"role", "content", "name"}:
            return None
        text, role = _text(message.get("content")), message.get("role")
        if text is None or role not in system_roles | {"user", "assistant"}:
            return None
        if role in system_roles:
            system.append(text)
        else:
            rendered.append(f"[{role}] {text}")
    return system, rendered


def instructions(system: Sequence[str], earlier: Sequence[str]) -> str:
    """The shared instructions: the system texts, the earlier turns, then :data:`TASK`."""
    parts = [text for text in system if text.strip()]
    if earlier:
        parts.append("The conversation so far, before each item's message:\n" + "\n".join(earlier))
    parts.append(TASK)
    return "\n\n".join(parts)


def last_user(messages: Any) -> tuple[list[Any], str] | None:
    """(earlier messages, the last user message's text), or ``None`` when the last
    message is not a plain-text user message."""
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if (
        not isinstance(last, Mapping)
        or last.get("role") != "user"
        or set(last) - {"role", "content"}
    ):
        return None
    item = _text(last.get("content"))
    return None if item is None else (messages[:-1], item)


def output_cap(kwargs: Mapping[str, Any], keys: Sequence[str]) -> tuple[bool, int | None]:
    """(valid, cap): the per-item output cap, if one is given as a positive int."""
    for key in keys:
        value = kwargs.get(key)
        if value is not None:
            return (isinstance(value, int) and value > 0), value
    return True, None


def stream_flag(value: Any) -> bool | None:
    """``stream=``: a bool, or absent; ``None`` for anything else (passed through)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    return None


def converted(convert: Callable[[Any], Any], value: Any) -> Any | None:
    """``convert(value)`` by one of the SDK's own helpers, or ``None`` when it refuses
    ``value`` (the call then goes to the SDK, whose method raises the same for it)."""
    try:
        return convert(value)
    except Exception:  # the real method raises the same for this call: let it speak
        return None


@dataclass(frozen=True)
class Transport:
    """How a call is sent, apart from what it asks: read by :func:`split_transport`.

    Attributes:
        sent: Options sent with the packed request as given (``extra_headers``); part
            of the call's key, so calls group only with calls that send the same.
        timeout: The caller's own ``timeout=`` in seconds (``None``: none given).
    """

    sent: Mapping[str, Any] = field(default_factory=dict)
    timeout: float | None = None


#: The SDK's per-request arguments that :func:`split_transport` reads.
TRANSPORT_ARGUMENTS = ("extra_headers", "extra_body", "extra_query", "timeout")
#: Headers that may change the answer (a beta feature): a call sending one passes through.
_ANSWERING_HEADERS = frozenset({"anthropic-beta", "openai-beta"})


def split_transport(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], Transport] | None:
    """(the other arguments, how the call is sent), or ``None`` when one of the SDK's
    per-request arguments may change the answer (the call then passes through).

    ``extra_headers`` of text values are sent with the packed request (calls group only
    with calls sending the same); ``extra_body`` and ``extra_query`` count only when
    ``None`` or empty; ``timeout`` is the caller's own limit, a positive number of
    seconds or ``None`` (an SDK ``Timeout`` object passes through).

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
    """
    rest = {k: v for k, v in kwargs.items() if k not in TRANSPORT_ARGUMENTS}
    if any(kwargs.get(name) not in (None, {}) for name in ("extra_body", "extra_query")):
        return None
    headers = _headers(kwargs.get("extra_headers"))
    timeout = _timeout(kwargs.get("timeout"))
    if headers is None or timeout is False:
        return None
    sent = {"extra_headers": headers} if headers else {}
    return rest, Transport(sent, timeout)


def _headers(value: Any) -> dict[str, str] | None:
    """``extra_headers`` in a canonical order, or ``None`` when not all text (or beta)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return None
    if any(k.lower() in _ANSWERING_HEADERS for k in value):
        return None
    return dict(sorted(value.items()))


def _timeout(value: Any) -> float | Literal[False] | None:
    """``timeout=`` in seconds; ``False`` for what is not a positive, finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return float(value) if math.isfinite(value) and value > 0 else False

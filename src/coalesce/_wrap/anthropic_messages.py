"""The translators of Anthropic's ``messages.create`` and ``beta.messages.create``,
plain and ``stream=True``.

Coalesced: one user message to answer (plain text, or text blocks), earlier turns of
plain text, a ``system`` string (or text blocks), no tools except one forced with
``tool_choice`` ``tool`` or ``any`` (:mod:`~coalesce._wrap.tools`: its
``input_schema`` is the output schema) or else an ``output_config`` of a
``json_schema`` format alone (its ``schema`` is), ``stream`` on or off, no thinking,
and the per-request arguments that do not change the answer
(:func:`~coalesce._wrap.call.split_transport`). ``beta.messages.create`` is read the
same when it asks for no betas, or only for betas that do not change the answer
(:data:`NEUTRAL_BETAS`). The caller gets a ``Message`` (``BetaMessage``), or a stream
of ``RawMessageStreamEvent`` (``BetaRawMessageStreamEvent``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from .call import (
    SdkCall,
    Transport,
    output_cap,
    stream_flag,
    streamed,
)
from .openai_chat import chat_turns, reading, translated_call
from .replies import anthropic_response, anthropic_stream
from .tools import ForcedTool, anthropic_forced_tool
from .translator import Answer, Translator

__all__ = [
    "NEUTRAL_BETAS",
    "AnthropicBetaMessagesCreate",
    "AnthropicMessagesCreate",
    "anthropic_beta_call",
    "anthropic_create_call",
]

_FORWARDED = frozenset({"temperature", "top_p", "top_k", "metadata", "service_tier"})
_HANDLED = frozenset(
    {"model", "messages", "system", "max_tokens", "tools", "tool_choice", "stream", "output_config"}
)

#: Betas that change how a request is cached or streamed, never what it answers: a
#: ``beta.messages.create`` call asking only for these is coalesced (the packed
#: request is sent without them). Any other beta passes the call through.
NEUTRAL_BETAS = frozenset({"prompt-caching-2024-07-31", "fine-grained-tool-streaming-2025-05-14"})


@reading(_FORWARDED | _HANDLED)
def anthropic_create_call(kwargs: dict[str, Any], transport: Transport) -> SdkCall | None:
    """The :class:`SdkCall` of a ``messages.create`` call, or ``None`` to pass it through."""
    model, conversation = kwargs.get("model"), chat_turns(kwargs.get("messages"), frozenset())
    system = _system(kwargs.get("system"))
    if not isinstance(model, str) or conversation is None or system is None:
        return None
    valid, cap = output_cap(kwargs, ("max_tokens",))
    answer = _answer(kwargs)
    stream = stream_flag(kwargs.get("stream"))
    if not valid or answer is None or stream is None:
        return None
    options = {k: v for k, v in kwargs.items() if k in _FORWARDED}
    shared, earlier, item = conversation
    call = translated_call(
        model, ([system, *shared], earlier, item), answer, options, cap, transport
    )
    return streamed(call, stream, include_usage=False)


def anthropic_beta_call(kwargs: Mapping[str, Any]) -> SdkCall | None:
    """The :class:`SdkCall` of a ``beta.messages.create`` call, or ``None`` to pass it
    through: the ``messages.create`` call it is, when its ``betas`` are all neutral.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
    """
    betas = kwargs.get("betas")
    if betas is not None and (
        not isinstance(betas, list) or not all(b in NEUTRAL_BETAS for b in betas)
    ):
        return None
    return anthropic_create_call({k: v for k, v in kwargs.items() if k != "betas"})


def _answer(
    kwargs: Mapping[str, Any],
) -> tuple[Mapping[str, Any] | None, ForcedTool | None] | None:
    """(output schema, forced tool) of the call's tools or ``output_config``; ``None``
    when they do not make one answer coalesce can ask for."""
    tool = anthropic_forced_tool(kwargs.get("tools"), kwargs.get("tool_choice"))
    output = _output_format(kwargs.get("output_config"))
    if tool is False or output is False:
        return None
    if tool is not None and output is not None:
        return None  # a forced tool and a reply format: which is the answer?
    return (output, None) if tool is None else (tool.schema, tool)


def _system(value: Any) -> str | None:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in value
    ):
        return "\n\n".join(b["text"] for b in value)
    return None


def _output_format(value: Any) -> Mapping[str, Any] | Literal[False] | None:
    """The schema of ``output_config={"format": {"type": "json_schema", ...}}``;
    ``None`` for none; ``False`` for any other ``output_config``."""
    if value is None:
        return None
    fmt = value.get("format") if isinstance(value, Mapping) and set(value) == {"format"} else None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        return False
    schema = fmt.get("schema")
    return schema if isinstance(schema, Mapping) else False


class AnthropicMessagesCreate(Translator):
    """``messages.create``: a ``Message``, or its events when streamed."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return anthropic_create_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        return anthropic_stream(answer) if answer.call.stream else anthropic_response(answer)


class AnthropicBetaMessagesCreate(Translator):
    """``beta.messages.create``: a ``BetaMessage``, or its events when streamed."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return anthropic_beta_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        if answer.call.stream:
            return anthropic_stream(answer, beta=True)
        return anthropic_response(answer, beta=True)

"""The translator of Anthropic's ``messages.create``, plain and ``stream=True``.

Coalesced: one user message to answer (plain text), earlier turns of plain text, a
``system`` string (or text blocks), no tools except one forced with ``tool_choice``
(its ``input_schema`` is the output schema) or else an ``output_config`` of a
``json_schema`` format alone (its ``schema`` is), ``stream`` on or off, no thinking.
The caller gets a ``Message``, or a stream of ``RawMessageStreamEvent``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from .call import (
    SdkCall,
    instructions,
    last_user,
    new_call,
    output_cap,
    stream_flag,
    streamed,
    turns,
)
from .replies import anthropic_response, anthropic_stream
from .translator import Answer, Translator

__all__ = ["AnthropicMessagesCreate", "anthropic_create_call"]

_FORWARDED = frozenset({"temperature", "top_p", "top_k", "metadata", "service_tier"})
_HANDLED = frozenset(
    {"model", "messages", "system", "max_tokens", "tools", "tool_choice", "stream", "output_config"}
)


def anthropic_create_call(kwargs: Mapping[str, Any]) -> SdkCall | None:
    """The :class:`SdkCall` of a ``messages.create`` call, or ``None`` to pass it through.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
    """
    unknown = set(kwargs) - _FORWARDED - _HANDLED
    model, split = kwargs.get("model"), last_user(kwargs.get("messages"))
    system = _system(kwargs.get("system"))
    if unknown or not isinstance(model, str) or split is None or system is None:
        return None
    earlier, item = split
    shared = turns(earlier, frozenset())
    valid, cap = output_cap(kwargs, ("max_tokens",))
    tool = _forced_tool(kwargs.get("tools"), kwargs.get("tool_choice"))
    output = _output_format(kwargs.get("output_config"))
    if shared is None or not valid or tool is False or output is False:
        return None
    if isinstance(tool, tuple) and output is not None:
        return None  # a forced tool and a reply format: which is the answer?
    name, schema = tool if isinstance(tool, tuple) else (None, output)
    stream = stream_flag(kwargs.get("stream"))
    if stream is None:
        return None
    options = {k: v for k, v in kwargs.items() if k in _FORWARDED}
    text = instructions([system, *shared[0]], shared[1])
    call = new_call(model, text, item, schema, options, cap, name)
    return streamed(call, stream, include_usage=False)


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


def _forced_tool(tools: Any, choice: Any) -> tuple[str, Mapping[str, Any]] | bool | None:
    """(name, input schema) of a forced tool; ``None`` for no tools; ``False`` otherwise."""
    if tools is None and choice is None:
        return None
    if (
        not isinstance(tools, list)
        or not isinstance(choice, Mapping)
        or choice.get("type") != "tool"
    ):
        return False
    named = [t for t in tools if isinstance(t, Mapping) and t.get("name") == choice.get("name")]
    if len(named) != 1 or not isinstance(named[0].get("input_schema"), Mapping):
        return False
    return str(named[0]["name"]), named[0]["input_schema"]


class AnthropicMessagesCreate(Translator):
    """``messages.create``: a ``Message``, or its events when streamed."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return anthropic_create_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        return anthropic_stream(answer) if answer.call.stream else anthropic_response(answer)

"""The translator of OpenAI's ``chat.completions.create``, plain and ``stream=True``.

Coalesced: one user message to answer (plain text), earlier turns of plain text, no
tools, ``n`` of 1, ``stream`` on or off (``stream_options`` only with
``include_usage``), ``response_format`` absent, ``text`` or ``json_schema``, and only
the sampling options coalesce knows to be per request. The caller gets a
``ChatCompletion``, or a stream of ``ChatCompletionChunk``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
from .replies import openai_response, openai_stream
from .translator import Answer, Translator

__all__ = ["OpenAIChatCreate", "openai_create_call"]

_FORWARDED = frozenset(
    {
        "temperature",
        "top_p",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "reasoning_effort",
        "service_tier",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "metadata",
        "store",
    }
)
_HANDLED = frozenset({"model", "messages", "n", "response_format", "stream", "stream_options"})
_CAPS = ("max_completion_tokens", "max_tokens")
_SYSTEM_ROLES = frozenset({"system", "developer"})


def openai_create_call(kwargs: Mapping[str, Any]) -> SdkCall | None:
    """The :class:`SdkCall` of a ``chat.completions.create`` call, or ``None`` to pass
    it through.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
    """
    unknown = set(kwargs) - _FORWARDED - _HANDLED - set(_CAPS)
    model, split = kwargs.get("model"), last_user(kwargs.get("messages"))
    if unknown or not isinstance(model, str) or split is None or kwargs.get("n") not in (None, 1):
        return None
    earlier, item = split
    shared = turns(earlier, _SYSTEM_ROLES)
    valid, cap = output_cap(kwargs, _CAPS)
    schema = _schema(kwargs.get("response_format"))
    if shared is None or not valid or schema is False:
        return None
    output_schema = schema if isinstance(schema, Mapping) else None
    stream = stream_flag(kwargs.get("stream"))
    usage = _include_usage(kwargs.get("stream_options"))
    if stream is None or usage is None or (usage and not stream):
        return None
    options = {k: v for k, v in kwargs.items() if k in _FORWARDED}
    call = new_call(model, instructions(*shared), item, output_schema, options, cap)
    return streamed(call, stream, usage)


def _include_usage(value: Any) -> bool | None:
    """OpenAI's ``stream_options``: only ``include_usage`` is understood."""
    if value is None:
        return False
    if isinstance(value, Mapping) and set(value) <= {"include_usage"}:
        return bool(value.get("include_usage"))
    return None


def _schema(value: Any) -> Mapping[str, Any] | bool | None:
    """The output schema; ``None`` for text; ``False`` for a format not coalesced."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return False
    if value.get("type") == "text":
        return None
    spec = value.get("json_schema")
    if value.get("type") == "json_schema" and isinstance(spec, Mapping):
        schema = spec.get("schema")
        return schema if isinstance(schema, Mapping) else False
    return False


class OpenAIChatCreate(Translator):
    """``chat.completions.create``: a ``ChatCompletion``, or its chunks when streamed."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return openai_create_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        return openai_stream(answer) if answer.call.stream else openai_response(answer)

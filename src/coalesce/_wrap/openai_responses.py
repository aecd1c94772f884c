"""The translator of OpenAI's ``responses.create`` (the Responses API), plain and streamed.

A Responses call is coalesced like a chat call: it is answered through the client's
chat completions, packed with calls like it. Coalesced:

- ``input`` a string, or a list of messages of text only (a string, or ``input_text`` /
  ``output_text`` parts) ending with one user message (the item); system and developer
  messages, and ``instructions=``, are the shared instructions, earlier user and
  assistant turns are rendered into them;
- ``text.format`` absent, ``text``, ``json_schema`` (its ``schema`` is the output
  schema) or ``json_object`` (any JSON object, asked as the chat call of
  :func:`~coalesce._wrap.call.json_object_call`), with ``text.verbosity``; or one ``function`` tool forced by
  ``tool_choice="required"`` or by name: its ``parameters`` are the output schema and
  the caller gets a ``function_call`` item;
- ``max_output_tokens`` (the caller's cap), ``temperature``, ``top_p``,
  ``service_tier``, ``user``, ``safety_identifier``, ``prompt_cache_key``,
  ``metadata``, ``reasoning={"effort": ...}``, ``stream``; the per-request arguments
  that do not change the answer (:func:`~coalesce._wrap.call.split_transport`), and
  those given with values that change nothing (:data:`_NEUTRAL`: ``store=False``,
  ``truncation``, ``parallel_tool_calls``, an empty ``include``, ...).

What relies on the server's state or tools passes through untouched:
``previous_response_id``, ``conversation``, ``background=True``, ``prompt``,
``include``, built-in tools, more than one tool, a tool the model may skip, any
unknown argument. ``store``: a coalesced call is answered through chat completions,
so nothing is stored on the server and its ``id`` cannot be retrieved or continued;
the API stores by default, but only an explicit ``store=True`` says the caller counts
on it, and that call passes through (``store`` absent or false coalesces).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from .call import (
    SdkCall,
    Transport,
    output_cap,
    stream_flag,
    streamed,
)
from .openai_chat import chat_turns, reading, translated_call
from .openai_responses_replies import responses_events, responses_response
from .tools import ForcedTool
from .translator import Answer, Translator

__all__ = ["OpenAIResponsesCreate", "responses_create_call"]

#: Sent with the packed chat request as they are (and so part of the call's kind).
_FORWARDED = frozenset(
    {
        "temperature",
        "top_p",
        "service_tier",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "metadata",
    }
)
_HANDLED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "text",
        "tools",
        "tool_choice",
        "reasoning",
        "stream",
        "stream_options",
        "max_output_tokens",
    }
)
_SYSTEM_ROLES = frozenset({"system", "developer"})
#: What :func:`_text` reads ``text.format`` of ``json_object`` as: any JSON object.
_JSON_OBJECT: Mapping[str, Any] = {"type": "object"}
_FUNCTION_KEYS = frozenset({"type", "name", "parameters", "strict", "description"})


def _none(value: Any) -> bool:
    return value is None


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (Mapping, list, tuple)) and not value)


def _flag(value: Any) -> bool:
    return value is None or isinstance(value, bool)


#: Arguments accepted only with these values, which leave the answer as it is; not sent.
_NEUTRAL: Mapping[str, Callable[[Any], bool]] = {
    "background": lambda value: value is None or value is False,
    "store": lambda value: value is None or value is False,
    "truncation": lambda value: value in (None, "auto", "disabled"),
    "parallel_tool_calls": _flag,
    "include": _empty,
    "top_logprobs": lambda value: value in (None, 0),
    **dict.fromkeys(
        (
            "previous_response_id",
            "conversation",
            "prompt",
            "max_tool_calls",
            "context_management",
            "image",
            "moderation",
            "access_programs",
            "background_options",
            "prompt_cache_options",
            "prompt_cache_retention",
        ),
        _none,
    ),
}


@reading(_FORWARDED | _HANDLED | set(_NEUTRAL))
def responses_create_call(kwargs: dict[str, Any], sending: Transport) -> SdkCall | None:
    """The :class:`SdkCall` of a ``responses.create`` call, or ``None`` to pass it through."""
    model, split = kwargs.get("model"), _conversation(kwargs)
    if not isinstance(model, str) or split is None:
        return None
    if not all(_NEUTRAL[name](kwargs[name]) for name in set(kwargs) & set(_NEUTRAL)):
        return None
    asked, (valid, cap) = _asked(kwargs), output_cap(kwargs, ("max_output_tokens",))
    stream = stream_flag(kwargs.get("stream"))
    if asked is None or not valid or stream is None:
        return None
    if not _stream_options(kwargs.get("stream_options"), stream):
        return None
    schema, options, tool = asked
    json_object = schema is _JSON_OBJECT  # answered as the chat call json_object_call reads
    call = translated_call(model, split, (schema, tool), options, cap, sending, json_object)
    return streamed(call, stream, include_usage=False)


def _asked(
    kwargs: Mapping[str, Any],
) -> tuple[Mapping[str, Any] | None, dict[str, Any], ForcedTool | None] | None:
    """(output schema, options sent, forced tool) of what the call asks for; ``None``
    when that is not one answer coalesce can ask for."""
    text = _text(kwargs.get("text"))
    tool = _forced_function(kwargs.get("tools"), kwargs.get("tool_choice"))
    effort = _reasoning(kwargs.get("reasoning"))
    if text is None or tool is False or effort is False:
        return None
    schema, options = text
    if tool is not None:
        if schema is not None:
            return None  # a forced tool and a reply format: which is the answer?
        schema = tool.schema
    options.update({k: v for k, v in kwargs.items() if k in _FORWARDED})
    if effort is not None:
        options["reasoning_effort"] = effort
    return schema, options, tool


def _conversation(kwargs: Mapping[str, Any]) -> tuple[list[str], list[str], str] | None:
    """(system texts, rendered earlier turns, the item) of ``instructions`` and ``input``."""
    given = kwargs.get("instructions")
    if given is not None and not isinstance(given, str):
        return None
    value = kwargs.get("input")
    messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
    if not isinstance(messages, list):
        return None
    plain = [_message(message) for message in messages]
    split = None if None in plain else chat_turns(plain, _SYSTEM_ROLES)
    return None if split is None else ([given or "", *split[0]], split[1], split[2])


_MESSAGE_KEYS = frozenset({"type", "role", "content"})
#: An assistant message given back from an earlier reply carries its id and status.
_ASSISTANT_KEYS = _MESSAGE_KEYS | {"id", "status"}
_PART_TYPES = {"assistant": "output_text"}


def _message(message: Any) -> dict[str, Any] | None:
    """An input message as ``{"role", "content"}`` of plain text, or ``None``."""
    if not isinstance(message, Mapping) or message.get("type", "message") != "message":
        return None
    role = message.get("role")
    allowed = _ASSISTANT_KEYS if role == "assistant" else _MESSAGE_KEYS
    if not isinstance(role, str) or set(message) - allowed:
        return None
    content = message.get("content")
    if isinstance(content, list):
        content = _parts_text(content, _PART_TYPES.get(role, "input_text"))
    return None if not isinstance(content, str) else {"role": role, "content": content}


def _parts_text(parts: list[Any], kind: str) -> str | None:
    """The text of content parts that are all text (of ``kind``), joined as chat
    messages of text parts are (:func:`~coalesce._wrap.call.turns`)."""
    texts = []
    for part in parts:
        if (
            not isinstance(part, Mapping)
            or part.get("type") != kind
            or not isinstance(part.get("text"), str)
            or any(part[key] for key in set(part) - {"type", "text"})  # annotations: []
        ):
            return None
        texts.append(part["text"])
    return "\n\n".join(texts) if texts else None


def _text(value: Any) -> tuple[Mapping[str, Any] | None, dict[str, Any]] | None:
    """(output schema or ``None`` for text, options) of ``text=``; ``None``: pass through."""
    if value is None:
        return None, {}
    if not isinstance(value, Mapping) or set(value) - {"format", "verbosity"}:
        return None
    verbosity = value.get("verbosity")
    options = {} if verbosity is None else {"verbosity": verbosity}
    fmt = value.get("format")
    if fmt is None or (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        return None, options
    if isinstance(fmt, Mapping) and dict(fmt) == {"type": "json_object"}:
        return _JSON_OBJECT, options
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        return None  # a format this cannot read
    schema = fmt.get("schema")
    return (schema, options) if isinstance(schema, Mapping) else None


def _forced_function(tools: Any, choice: Any) -> ForcedTool | Literal[False] | None:
    """The one function tool the call must call (``tool_choice="required"`` or naming
    it); ``None`` for no tools; ``False`` for anything else (passed through)."""
    if _empty(tools):
        return None if choice in (None, "auto", "none") else False
    if not isinstance(tools, list) or len(tools) != 1 or not isinstance(tools[0], Mapping):
        return False
    tool = tools[0]
    name, parameters, description = (tool.get(k) for k in ("name", "parameters", "description"))
    if tool.get("type") != "function" or set(tool) - _FUNCTION_KEYS:
        return False
    if not isinstance(name, str) or not name or not isinstance(parameters, Mapping):
        return False
    if not isinstance(description, (str, type(None))):
        return False
    forced = choice == "required" or choice == {"type": "function", "name": name}
    return ForcedTool(name, parameters, description) if forced else False


def _reasoning(value: Any) -> str | bool | None:
    """``reasoning={"effort": ...}``'s effort; ``None`` for none; ``False`` when it asks
    for more than an effort (summaries, modes: passed through)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or any(
        value[key] is not None for key in set(value) - {"effort"}
    ):
        return False
    effort = value.get("effort")
    return effort if isinstance(effort, str) or effort is None else False


def _stream_options(value: Any, stream: bool) -> bool:
    """Whether ``stream_options`` can be left out: none, or ``include_obfuscation``
    alone on a streamed call (coalesced events carry no obfuscation padding)."""
    if value is None:
        return True
    return stream and isinstance(value, Mapping) and set(value) <= {"include_obfuscation"}


class OpenAIResponsesCreate(Translator):
    """``responses.create``: a ``Response``, or its events when streamed."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return responses_create_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        if answer.call.stream:
            return responses_events(answer, given)
        return responses_response(answer, given)

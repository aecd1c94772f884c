"""The translator of OpenAI's ``chat.completions.create``, plain and ``stream=True``.

Coalesced: one user message to answer (plain text, or text parts), earlier turns of
plain text (``system`` and ``developer`` messages are the instructions), ``n`` of 1,
``stream`` on or off (``stream_options`` only with ``include_usage``),
``response_format`` absent, ``text``, ``json_schema`` or ``json_object`` (any JSON
object, :func:`~coalesce._wrap.call.json_object_call`), or else one function tool the
call forces (:mod:`~coalesce._wrap.tools`: its ``parameters`` are the output schema),
the sampling options coalesce knows to be per request, and the per-request arguments
that do not change the answer (:func:`~coalesce._wrap.call.split_transport`). The
caller gets a ``ChatCompletion`` (a tool call of its own for a forced tool), or a
stream of ``ChatCompletionChunk``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Set
from typing import Any

from ..providers._openai import CREATE_SECURITY, POST_OPTIONS
from .call import (
    JSON_OBJECT,
    SdkCall,
    Transport,
    instructions,
    json_object_call,
    last_user,
    new_call,
    output_cap,
    split_transport,
    stream_flag,
    streamed,
    turns,
)
from .replies import openai_response, openai_stream
from .tools import ForcedTool, openai_forced_tool
from .translator import Answer, Translator

__all__ = [
    "OpenAIChatCreate",
    "chat_turns",
    "openai_create_call",
    "posted_create",
    "reading",
    "translated_call",
]

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
_HANDLED = frozenset(
    {
        "model",
        "messages",
        "n",
        "response_format",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
_CAPS = ("max_completion_tokens", "max_tokens")
_SYSTEM_ROLES = frozenset({"system", "developer"})


#: (system texts, rendered earlier turns, the item) of a call (:func:`chat_turns`).
Conversation = tuple[list[str], list[str], str]
#: A translator's reading of a call's arguments and transport (:func:`reading`).
Read = Callable[[dict[str, Any], Transport], SdkCall | None]


def reading(known: Set[str]) -> Callable[[Read], Callable[[Mapping[str, Any]], SdkCall | None]]:
    """Makes a :data:`Read` the reading of a call's keyword arguments (sentinels and
    coalesce headers removed), which passes the call through (``None``) when one is not
    ``known`` or :func:`~coalesce._wrap.call.split_transport` passes it through."""

    def decorate(read: Read) -> Callable[[Mapping[str, Any]], SdkCall | None]:
        @functools.wraps(read)
        def reader(kwargs: Mapping[str, Any]) -> SdkCall | None:
            split = split_transport(kwargs)
            return None if split is None or set(split[0]) - known else read(*split)

        return reader

    return decorate


@reading(_FORWARDED | _HANDLED | set(_CAPS))
def openai_create_call(kwargs: dict[str, Any], transport: Transport) -> SdkCall | None:
    """The :class:`SdkCall` of a ``chat.completions.create`` call, or ``None`` to pass
    it through."""
    model, conversation = kwargs.get("model"), chat_turns(kwargs.get("messages"), _SYSTEM_ROLES)
    if not isinstance(model, str) or conversation is None or kwargs.get("n") not in (None, 1):
        return None
    valid, cap = output_cap(kwargs, _CAPS)
    json_mode = _json_object(kwargs.get("response_format"))
    answer = _answer({**kwargs, "response_format": None} if json_mode else kwargs)
    stream = stream_flag(kwargs.get("stream"))
    usage = _include_usage(kwargs.get("stream_options"))
    if not valid or answer is None or stream is None or usage is None:
        return None
    if usage and not stream:
        return None
    if json_mode and answer[1] is not None:
        return None  # a forced tool and a reply format: which is the answer?
    options = {k: v for k, v in kwargs.items() if k in _FORWARDED}
    call = translated_call(model, conversation, answer, options, cap, transport, json_mode)
    return streamed(call, stream, usage)


def chat_turns(messages: Any, system_roles: frozenset[str]) -> Conversation | None:
    """(system texts, rendered earlier turns, the item) of chat messages of plain text
    ending with the user's (:func:`~coalesce._wrap.call.last_user`), or ``None``."""
    last = last_user(messages)
    shared = None if last is None else turns(last[0], system_roles)
    return None if last is None or shared is None else (*shared, last[1])


def translated_call(
    model: str,
    conversation: Conversation,
    answer: tuple[Mapping[str, Any] | None, ForcedTool | None],
    options: Mapping[str, Any],
    cap: int | None,
    transport: Transport,
    json_object: bool = False,
) -> SdkCall:
    """The call a translator reads (``stream`` aside): the item of the ``conversation``
    asked of ``model`` under its system texts (and the forced tool's instruction) and
    earlier turns, for the answer's schema (its forced tool's), or for any JSON object
    with ``json_object``; ``options`` sent with the transport's own, under its timeout."""
    (system, earlier, item), (schema, tool) = conversation, answer
    notes = [] if tool is None else [tool.instruction()]
    text = instructions([*system, *notes], earlier)
    sent = {**options, **transport.sent}
    if json_object:
        return json_object_call(model, text, item, sent, cap, transport.timeout)
    name = None if tool is None else tool.name
    return new_call(model, text, item, schema, sent, cap, name, transport.timeout)


def _json_object(value: Any) -> bool:
    """``response_format={"type": "json_object"}``: the answer is any JSON object."""
    return isinstance(value, Mapping) and dict(value) == JSON_OBJECT


def _answer(
    kwargs: Mapping[str, Any],
) -> tuple[Mapping[str, Any] | None, ForcedTool | None] | None:
    """(output schema, forced tool) of the call's ``response_format`` or tools;
    ``None`` when they do not make one answer coalesce can ask for."""
    schema = _schema(kwargs.get("response_format"))
    tool = openai_forced_tool(
        kwargs.get("tools"), kwargs.get("tool_choice"), kwargs.get("parallel_tool_calls")
    )
    if schema is False or tool is False:
        return None
    if tool is None:
        return (schema if isinstance(schema, Mapping) else None), None
    if kwargs.get("response_format") is not None:
        return None  # a forced tool and a reply format: which is the answer?
    return tool.schema, tool


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


#: ``post()`` options and the ``create()`` argument each stands for.
_POST_OPTIONS = {option: argument for argument, option in POST_OPTIONS.items()}


def posted_create(path: str, posted: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``chat.completions.create`` arguments that send what a ``client.post(path,
    **posted)`` call sends, or ``None`` when it is not such a call.

    litellm's ``acompletion(client=...)`` posts a chat completion's body through the
    client's own ``post`` (with the raw-response header); ``create`` sends the same body
    to the same path, so the call can go through the coalescing ``create`` (and its
    translator) instead. Only a JSON body of ``create``'s own arguments, ``cast_to``
    ``ChatCompletion``, and options ``create`` itself would give (headers, query,
    extra body, timeout, bearer authentication) are taken.

    Args:
        path: The path posted to.
        posted: ``post``'s keyword arguments.
    """
    from openai.types.chat import ChatCompletion

    body, options = posted.get("body"), posted.get("options") or {}
    if path != "/chat/completions" or posted.get("cast_to") is not ChatCompletion:
        return None
    if set(posted) - {"cast_to", "body", "options", "stream", "stream_cls"}:
        return None  # content=, files=: not a chat completion's body
    if not isinstance(body, Mapping) or not isinstance(options, Mapping):
        return None
    if set(body) - _create_parameters() or bool(body.get("stream")) != bool(posted.get("stream")):
        return None
    if set(options) - set(_POST_OPTIONS) - {"security"}:
        return None
    if options.get("security") not in (None, CREATE_SECURITY):
        return None
    sent = {_POST_OPTIONS[k]: v for k, v in options.items() if k in _POST_OPTIONS}
    if "extra_headers" in sent:
        sent["extra_headers"] = dict(sent["extra_headers"])
    return {**body, **sent}


def _create_parameters() -> frozenset[str]:
    """The body arguments of the installed SDK's ``chat.completions.create``."""
    import inspect

    from openai.resources.chat.completions import AsyncCompletions

    names = inspect.signature(AsyncCompletions.create).parameters
    return frozenset(names) - {"self", "extra_headers", "extra_query", "extra_body", "timeout"}


class OpenAIChatCreate(Translator):
    """``chat.completions.create``: a ``ChatCompletion``, or its chunks when streamed."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return openai_create_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        return openai_stream(answer) if answer.call.stream else openai_response(answer)

"""The translator of OpenAI's ``responses.parse(text_format=Model)``.

``parse`` is read as the ``responses.create`` call the SDK itself sends for it: the
``json_schema`` text format the SDK derives from ``Model``
(``openai.lib._parsing._responses.type_to_text_format_param``). It therefore shares
requests with equal ``create`` calls; its caller gets the ``Response`` built for
``create``, parsed by the SDK's own ``parse_response`` into a ``ParsedResponse`` whose
``output_parsed`` is an instance of its own model. A call this does not cover
(``parse_as``, ``stream=True``, ``text_format`` next to ``text.format``, chat-shaped
pydantic tools, a type the SDK cannot convert) goes to the real ``parse()``, which
speaks for itself.

``responses.stream(...)`` needs no translator: the SDK's own helper calls the
resource's ``create(stream=True, ...)``, which on a wrapped client is the coalescing
one (:mod:`~coalesce._wrap.openai_responses`), and builds its
``AsyncResponseStreamManager`` around what that returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .call import SdkCall, converted
from .openai_responses import responses_create_call
from .openai_responses_replies import responses_response
from .translator import Answer, Translator

__all__ = ["OpenAIResponsesParse", "responses_parse_call"]


def _create_arguments(kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``responses.create`` arguments the SDK's ``parse()`` sends for ``kwargs``, or
    ``None`` for a call left to the real ``parse()``."""
    tools = kwargs.get("tools")
    chat_tools = isinstance(tools, list) and any(
        isinstance(tool, Mapping) and "function" in tool for tool in tools
    )
    if kwargs.get("stream") or "parse_as" in kwargs or chat_tools:
        return None
    rest = {k: v for k, v in kwargs.items() if k not in ("text_format", "stream")}
    if "text_format" not in kwargs:
        return rest
    text = kwargs.get("text") or {}
    if not isinstance(text, Mapping) or "format" in text:
        return None  # the SDK raises TypeError for both: let it
    from ..providers._sdk_openai import type_to_text_format_param

    fmt = converted(type_to_text_format_param, kwargs["text_format"])
    return None if fmt is None else {**rest, "text": {**text, "format": fmt}}


def responses_parse_call(kwargs: Mapping[str, Any]) -> SdkCall | None:
    """The :class:`SdkCall` of a ``responses.parse`` call, or ``None`` to pass it through.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
    """
    create = _create_arguments(kwargs)
    return None if create is None else responses_create_call(create)


class OpenAIResponsesParse(Translator):
    """``responses.parse``: a ``ParsedResponse``, as the SDK builds it."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return responses_parse_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        import openai

        from ..providers._sdk_openai import parse_response

        create = _create_arguments(given) or {}
        return parse_response(
            text_format=given.get("text_format", openai.omit),
            input_tools=given.get("tools", openai.omit),
            response=responses_response(answer, create),
        )

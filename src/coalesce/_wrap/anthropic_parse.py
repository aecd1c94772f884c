"""The translator of Anthropic's ``messages.parse`` (the SDK's ``parse()`` helper).

``parse(output_format=Model, ...)`` is read as the ``messages.create`` call the SDK
itself sends for it: ``output_config={"format": ...}`` with ``anthropic.transform_schema``
of ``Model``'s JSON schema. It therefore shares requests with equal ``create`` calls;
its caller gets the ``Message`` built for ``create``, parsed by the SDK's own parser
into a ``ParsedMessage`` of its own type. A call this does not cover (``stream=``, a
type the SDK cannot convert, an ``output_config`` of its own) goes to the real
``parse()``, which speaks for itself. The SDK is imported only when a parse call is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .anthropic_messages import anthropic_create_call
from .call import SdkCall, converted
from .replies import anthropic_response
from .translator import Answer, Translator

__all__ = ["AnthropicMessagesParse", "anthropic_parse_call"]


def _output_config_format(output_format: Any) -> dict[str, Any]:
    """The ``output_config.format`` the SDK sends for the type ``output_format``."""
    import anthropic
    import pydantic

    schema = pydantic.TypeAdapter(output_format).json_schema()
    return {"type": "json_schema", "schema": anthropic.transform_schema(schema)}


def anthropic_parse_call(kwargs: Mapping[str, Any]) -> SdkCall | None:
    """The :class:`SdkCall` of a ``messages.parse`` call, or ``None`` to pass it through.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
    """
    if "stream" in kwargs or "output_config" in kwargs:
        return None  # parse() refuses the first and merges the second: the SDK's call
    rest = {k: v for k, v in kwargs.items() if k != "output_format"}
    output_format = kwargs.get("output_format")
    if output_format is None:
        return anthropic_create_call(rest)
    if isinstance(output_format, Mapping):  # the SDK refuses a schema dict here
        return None
    fmt = converted(_output_config_format, output_format)
    if fmt is None:
        return None
    return anthropic_create_call({**rest, "output_config": {"format": fmt}})


class AnthropicMessagesParse(Translator):
    """``messages.parse``: a ``ParsedMessage``, as the SDK builds it."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return anthropic_parse_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        import anthropic

        from ..providers._sdk_anthropic import parse_response

        output_format = given.get("output_format")
        fmt = anthropic.NOT_GIVEN if output_format is None else output_format
        return parse_response(output_format=fmt, response=anthropic_response(answer))

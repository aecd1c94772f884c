"""The SDKs' ``parse()`` helpers through :func:`coalesce.wrap`.

``chat.completions.parse(response_format=Model, ...)`` is planned as the
``chat.completions.create`` call the SDK itself sends for it: the ``json_schema``
response format the SDK derives from ``Model`` (``openai.lib.type_to_response_format_param``).
Anthropic's ``messages.parse(output_format=Model, ...)`` likewise, as ``messages.create``
with ``output_config={"format": ...}`` (``anthropic.transform_schema`` of ``Model``'s
JSON schema). A parse call therefore shares requests with equal ``create`` calls; its
caller's SDK object is the one built for ``create`` (:mod:`coalesce._wrap.replies`),
parsed by the SDK's own parser into the caller's own type.

A call these translations do not cover (``stream=``, a type the SDK cannot convert,
Anthropic's ``output_config``) gets no plan and goes to the real ``parse()``, which
speaks for itself. The SDKs are imported only when a parse call is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._calls import Job
from .._exceptions import TruncatedOutputError
from .plan import Plan, anthropic_plan, openai_plan
from .replies import anthropic_response, openai_response

__all__ = [
    "anthropic_parse_plan",
    "anthropic_parsed",
    "openai_length_error",
    "openai_parse_plan",
    "openai_parsed",
]

Respond = Callable[[Any, Job, Plan], Any]


def _converted(convert: Callable[[Any], Any], value: Any) -> Any | None:
    """``convert(value)``, or ``None`` when the SDK's helper refuses ``value``."""
    try:
        return convert(value)
    except Exception:  # the real parse() raises the same for this call: let it speak
        return None


def openai_parse_plan(kwargs: Mapping[str, Any], budget: float | None = None) -> Plan | None:
    """The plan of a ``chat.completions.parse`` call, or ``None`` to pass it through.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
        budget: The call's own budget, if it set one.
    """
    if "stream" in kwargs:  # parse() takes no stream=: the SDK says so itself
        return None
    if "response_format" not in kwargs:
        return openai_plan(kwargs, budget)
    from openai.lib import type_to_response_format_param

    fmt = _converted(type_to_response_format_param, kwargs["response_format"])
    return None if fmt is None else openai_plan({**kwargs, "response_format": fmt}, budget)


def openai_parsed(response_format: Any) -> Respond:
    """Builds a caller's ``ParsedChatCompletion`` as the SDK's ``parse()`` does.

    Args:
        response_format: The caller's own ``response_format`` (a type or a dict), or
            ``None`` when it gave none.
    """
    import openai
    from openai.lib._parsing import parse_chat_completion

    fmt = openai.omit if response_format is None else response_format

    def respond(value: Any, job: Job, plan: Plan) -> Any:
        completion = openai_response(value, job, plan)
        # No tools: a call with tools is passed through.
        return parse_chat_completion(
            response_format=fmt, input_tools=openai.omit, chat_completion=completion
        )

    return respond


def openai_length_error(error: TruncatedOutputError, model: str) -> Exception:
    """What the SDK's ``parse()`` raises for a reply cut off by its length limit.

    A ``LengthFinishReasonError`` whose ``completion`` has ``finish_reason="length"``,
    the item's partial text (if any) and no usage (a failed caller's share is not kept).

    Args:
        error: Coalesce's error for the item.
        model: The model the caller asked for.
    """
    import openai
    from openai.types.chat import ChatCompletion

    text = error.raw if isinstance(error.raw, str) else None
    completion = ChatCompletion.model_validate(
        {
            "id": f"chatcmpl-coalesce-{error.item_id}",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "finish_reason": "length",
                    "logprobs": None,
                }
            ],
        }
    )
    return openai.LengthFinishReasonError(completion=completion)


def _anthropic_format(output_format: Any) -> dict[str, Any]:
    """The ``output_config.format`` the SDK sends for the type ``output_format``."""
    import anthropic
    import pydantic

    schema = pydantic.TypeAdapter(output_format).json_schema()
    return {"type": "json_schema", "schema": anthropic.transform_schema(schema)}


def anthropic_parse_plan(kwargs: Mapping[str, Any], budget: float | None = None) -> Plan | None:
    """The plan of a ``messages.parse`` call, or ``None`` to pass it through.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
        budget: The call's own budget, if it set one.
    """
    if "stream" in kwargs or "output_config" in kwargs:
        return None  # parse() refuses the first and merges the second: the SDK's call
    rest = {k: v for k, v in kwargs.items() if k != "output_format"}
    output_format = kwargs.get("output_format")
    if output_format is None:
        return anthropic_plan(rest, budget)
    if isinstance(output_format, Mapping):  # the SDK refuses a schema dict here
        return None
    fmt = _converted(_anthropic_format, output_format)
    if fmt is None:
        return None
    return anthropic_plan({**rest, "output_config": {"format": fmt}}, budget)


def anthropic_parsed(output_format: Any) -> Respond:
    """Builds a caller's ``ParsedMessage`` as the SDK's ``parse()`` does.

    Args:
        output_format: The caller's own ``output_format`` (a type), or ``None`` when it
            gave none.
    """
    import anthropic
    from anthropic.lib._parse._response import parse_response

    given = anthropic.NOT_GIVEN if output_format is None else output_format

    def respond(value: Any, job: Job, plan: Plan) -> Any:
        message = anthropic_response(value, job, plan)
        return parse_response(output_format=given, response=message)

    return respond

"""The translator of OpenAI's ``chat.completions.parse`` (the SDK's ``parse()`` helper).

``parse(response_format=Model, ...)`` is read as the ``chat.completions.create`` call
the SDK itself sends for it: the ``json_schema`` response format the SDK derives from
``Model`` (``openai.lib.type_to_response_format_param``). It therefore shares requests
with equal ``create`` calls; its caller gets the ``ChatCompletion`` built for
``create``, parsed by the SDK's own parser into a ``ParsedChatCompletion`` of its own
type. A forced strict function tool (``tools=[openai.pydantic_function_tool(Model)]``)
is read as ``create`` reads it, and its caller's tool call gets the SDK's own
``parsed_arguments``. A call this does not cover (``stream=``, a type the SDK cannot
convert, a tool that is not strict) goes to the real ``parse()``, which speaks for
itself. The SDK is imported only when a parse call is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exceptions import TruncatedOutputError
from .call import SdkCall, converted
from .openai_chat import openai_create_call
from .replies import openai_response
from .translator import Answer, Translator

__all__ = ["OpenAIChatParse", "openai_length_error", "openai_parse_call"]


def openai_parse_call(kwargs: Mapping[str, Any]) -> SdkCall | None:
    """The :class:`SdkCall` of a ``chat.completions.parse`` call, or ``None`` to pass
    it through.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
    """
    if "stream" in kwargs:  # parse() takes no stream=: the SDK says so itself
        return None
    if "tools" in kwargs:
        from ..providers._sdk_openai import validate_input_tools

        if converted(validate_input_tools, kwargs["tools"]) is None:
            return None  # a tool parse() cannot parse: the SDK's own error
    if "response_format" not in kwargs:
        return openai_create_call(kwargs)
    from ..providers._sdk_openai import type_to_response_format_param

    fmt = converted(type_to_response_format_param, kwargs["response_format"])
    return None if fmt is None else openai_create_call({**kwargs, "response_format": fmt})


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


class OpenAIChatParse(Translator):
    """``chat.completions.parse``: a ``ParsedChatCompletion``, as the SDK builds it."""

    def read(self, given: Mapping[str, Any]) -> SdkCall | None:
        return openai_parse_call(given)

    def reply(self, answer: Answer, given: Mapping[str, Any]) -> Any:
        import openai

        from ..providers._sdk_openai import parse_chat_completion

        response_format, tools = given.get("response_format"), given.get("tools")
        return parse_chat_completion(
            response_format=openai.omit if response_format is None else response_format,
            input_tools=openai.omit if tools is None else tools,
            chat_completion=openai_response(answer),
        )

    def error(self, error: Exception, given: Mapping[str, Any]) -> Exception:
        if isinstance(error, TruncatedOutputError):
            return openai_length_error(error, str(given.get("model")))
        return error

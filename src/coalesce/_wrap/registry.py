"""Which :class:`~.translator.Translator` serves which SDK method, and where it posts.

One table per SDK, keyed by the method's attribute path on the client. The client
intercepts exactly these paths (those the installed SDK has) and leaves every other
attribute to the SDK; their ``with_raw_response`` and ``with_streaming_response``
forms, which the SDK builds around the same methods, follow. A new SDK method
(``responses.create``) is a new translator module, one entry in :data:`TRANSLATORS`
and its resource's :class:`Endpoint` in :data:`ENDPOINTS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .anthropic_messages import AnthropicBetaMessagesCreate, AnthropicMessagesCreate
from .anthropic_parse import AnthropicMessagesParse
from .openai_chat import OpenAIChatCreate
from .openai_parse import OpenAIChatParse
from .openai_responses import OpenAIResponsesCreate
from .openai_responses_parse import OpenAIResponsesParse
from .translator import Translator

__all__ = ["ENDPOINTS", "TRANSLATORS", "Endpoint", "endpoint_of"]

_openai_create, _openai_parse = OpenAIChatCreate(), OpenAIChatParse()

#: ``TRANSLATORS[sdk][path]``: the translator of the method at ``client.<path>``, for
#: ``sdk`` ``"openai"`` or ``"anthropic"``.
TRANSLATORS: Mapping[str, Mapping[str, Translator]] = MappingProxyType(
    {
        "openai": MappingProxyType(
            {
                "chat.completions.create": _openai_create,
                "chat.completions.parse": _openai_parse,
                # The SDK's older home of parse(): the same methods.
                "beta.chat.completions.create": _openai_create,
                "beta.chat.completions.parse": _openai_parse,
                "responses.create": OpenAIResponsesCreate(),
                "responses.parse": OpenAIResponsesParse(),
            }
        ),
        "anthropic": MappingProxyType(
            {
                "messages.create": AnthropicMessagesCreate(),
                "messages.parse": AnthropicMessagesParse(),
                "beta.messages.create": AnthropicBetaMessagesCreate(),
            }
        ),
    }
)


@dataclass(frozen=True)
class Endpoint:
    """Where a resource's methods post, for the raw responses of coalesced calls.

    Attributes:
        url: The path the SDK posts to, from the client's ``base_url``.
        events: ``"module:Name"`` of the SDK type of its stream's events (what the
            SDK's ``AsyncStream`` decodes each server-sent event into).
    """

    url: str
    events: str


_chat = Endpoint("/chat/completions", "openai.types.chat:ChatCompletionChunk")

#: ``ENDPOINTS[sdk][resource]``: the endpoint of the resource at ``client.<resource>``.
ENDPOINTS: Mapping[str, Mapping[str, Endpoint]] = MappingProxyType(
    {
        "openai": MappingProxyType(
            {
                "chat.completions": _chat,
                "beta.chat.completions": _chat,
                "responses": Endpoint("/responses", "openai.types.responses:ResponseStreamEvent"),
            }
        ),
        "anthropic": MappingProxyType(
            {
                "messages": Endpoint("/v1/messages", "anthropic.types:RawMessageStreamEvent"),
                "beta.messages": Endpoint(
                    "/v1/messages?beta=true", "anthropic.types.beta:BetaRawMessageStreamEvent"
                ),
            }
        ),
    }
)


def endpoint_of(sdk: str, path: str) -> Endpoint | None:
    """The endpoint of the method at ``client.<path>``, if :data:`ENDPOINTS` names it
    (without one, a raw or streamed-raw call of that method is passed through)."""
    return ENDPOINTS.get(sdk, {}).get(path.rpartition(".")[0])

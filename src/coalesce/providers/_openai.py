"""OpenAI Chat Completions through the official SDK (``coalesce-llm[openai]``).

The SDK is imported only when a provider is used, never by ``import coalesce``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._pricing import PromptCache
from ._base import Completion, CompletionRequest
from ._http import (
    REPLY_FIELDS,
    Collector,
    chat_body,
    chat_completion,
    lower_headers,
    read_chat_stream,
)
from ._sdk import SDKProvider, sdk_transport_errors

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIProvider"]


#: Hosts that enforce a strict ``json_schema`` response format (structured outputs).
_ENFORCING_HOSTS = ("api.openai.com",)
_ENFORCING_SUFFIXES = (".openai.azure.com",)


def _enforcing_host(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    return host in _ENFORCING_HOSTS or host.endswith(_ENFORCING_SUFFIXES)


class OpenAIProvider(SDKProvider["openai.AsyncOpenAI"]):
    """Chat completions through an ``openai.AsyncOpenAI`` client.

    The client is copied with ``max_retries=0`` (yours is left as it is): retries are
    coalesce's job (:func:`~coalesce._engine.retry.complete_with_retries`), so the two never
    multiply.

    Args:
        client: The SDK client (its API key, base URL, timeout and headers are used).
        strict: Ask for strict structured outputs (the reply schema goes through
            ``strict_openai_schema``); set false for schemas strict mode cannot express.
        name: The provider's name in statistics.
        enforces_schema: Whether the server holds every reply to the schema; ``None``:
            only OpenAI's own API (``api.openai.com``, Azure OpenAI) with ``strict``
            schemas is taken to. Servers that merely accept ``response_format`` (many
            OpenAI-compatible ones) may write an id twice; streamed answers from them
            are held until the reply ends.
        prompt_cache: How the server caches prompt prefixes; ``None``: OpenAI's own API
            caches from 1,024 tokens (at the model's cached-input price), other hosts
            are taken not to until a reply reports cached tokens. ``False``: never.
    """

    sdk = "openai"

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        *,
        strict: bool = True,
        name: str = "openai",
        enforces_schema: bool | None = None,
        prompt_cache: PromptCache | bool | None = None,
    ) -> None:
        super().__init__(client)
        self.name = name
        self.strict = strict
        official = _enforcing_host(str(client.base_url))
        if enforces_schema is None:
            enforces_schema = strict and official
        self.enforces_schema = enforces_schema
        if prompt_cache is None or prompt_cache is True:
            prompt_cache = PromptCache() if official or prompt_cache else False
        self._prompt_cache = prompt_cache if isinstance(prompt_cache, PromptCache) else None

    #: Which batch API serves this provider's deferred lane.
    batch_api = "openai"

    def prompt_cache(self, model: str) -> PromptCache | None:
        """How the server caches prompt prefixes (the same for every model).

        Args:
            model: The model name.
        """
        return self._prompt_cache

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        """Send ``request`` with ``chat.completions.create``; stream it if ``request.stream``.

        Args:
            request: The request.
            on_text: Receives each text delta of a streamed reply.

        Raises:
            openai.APIStatusError: An error answer (``RateLimitError`` for 429...).
            openai.APIConnectionError: The connection failed or dropped.
            openai.APITimeoutError: The request timed out.
        """
        collector = Collector(on_text)
        raw = await _post(self.client, self.arguments(request))
        headers = lower_headers(raw.headers.items())
        if request.stream:
            return await _read_stream(raw.http_response, collector, headers)
        return chat_completion(raw.http_response.json(), collector, headers, REPLY_FIELDS)

    def arguments(self, request: CompletionRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request``.

        ``request.options`` come first, so the request's own fields win.

        ``prompt_cache_key`` is the request's ``cache_key`` (unless the options set one),
        so that requests sharing a prefix reach the same cache.

        Args:
            request: The request.
        """
        body = chat_body(
            request, structured=True, strict=self.strict, max_tokens_key="max_completion_tokens"
        )
        if request.cache_key is not None and self._prompt_cache is not None:
            body.setdefault("prompt_cache_key", request.cache_key)
        return body

    def __repr__(self) -> str:
        return f"<OpenAIProvider base_url={str(self._client.base_url)!r} strict={self.strict}>"


#: ``create()``'s arguments that are not the request's body, and the ``post()`` option
#: each one is (what ``create()`` itself makes of them).
POST_OPTIONS = {
    "extra_headers": "headers",
    "extra_query": "params",
    "extra_body": "extra_json",
    "timeout": "timeout",
}
#: What ``create()`` asks of ``post()`` besides: bearer authentication.
CREATE_SECURITY = {"bearer_auth": True}
#: The SDK's "not given" sentinels: ``create()`` leaves such arguments out.
_UNSENT = ("NotGiven", "Omit")


async def _post(client: Any, arguments: dict[str, Any]) -> Any:
    """The raw response to ``chat.completions.create(**arguments)``, posted as
    ``create()`` posts it, without its per-field transform of the body: the body is
    coalesce's own JSON (text messages, a schema, the options as given), which the
    transform would give back as it is, at a millisecond of CPU a request."""
    from openai import AsyncStream
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    from ._sdk_openai import RAW_RESPONSE_HEADER, FinalRequestOptions

    arguments = {k: v for k, v in arguments.items() if type(v).__name__ not in _UNSENT}
    options = {to: arguments.pop(name) for name, to in POST_OPTIONS.items() if name in arguments}
    options = {k: v for k, v in options.items() if v is not None or k == "timeout"}
    options["headers"] = {**(options.get("headers") or {}), RAW_RESPONSE_HEADER: "true"}
    if "security" in FinalRequestOptions.model_fields:  # releases that have it
        options["security"] = dict(CREATE_SECURITY)
    stream = bool(arguments.get("stream"))
    return await client.post(
        "/chat/completions",
        body=arguments,
        options=options,
        cast_to=ChatCompletion,
        stream=stream,
        stream_cls=AsyncStream[ChatCompletionChunk],
    )


async def _read_stream(response: Any, collector: Collector, headers: dict[str, str]) -> Completion:
    """Read the events from the response itself, not through the SDK's ``AsyncStream``.

    The SDK's stream leaves an inner async generator unclosed at ``[DONE]``, which
    trio reports as a ``ResourceWarning`` when it is collected.
    """
    import openai

    try:
        with sdk_transport_errors(openai, response.request):
            lines = response.aiter_lines()
            return await read_chat_stream(lines, collector, headers, _stream_error(response))
    finally:
        await response.aclose()


def _stream_error(response: Any) -> Callable[[Mapping[str, Any]], Exception]:
    def error(body: Mapping[str, Any]) -> Exception:
        import openai

        message = str(body.get("message") or body)
        return openai.APIError(message, response.request, body=dict(body))

    return error

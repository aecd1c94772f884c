"""Anthropic Messages through the official SDK (``coalesce-llm[anthropic]``).

Structured replies use a forced tool: its ``input_schema`` is the reply schema and the
reply text is the tool call's input as JSON. The SDK is imported only when used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._pricing import PromptCache
from ._base import Completion, CompletionRequest, Usage
from ._http import Collector, lower_headers
from ._sdk import SDKProvider, sdk_transport_errors
from ._shapes import anthropic_tool

if TYPE_CHECKING:
    import anthropic

__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicProvider", "finish_reason"]

#: ``max_tokens`` sent when the request sets no cap (Anthropic requires one).
DEFAULT_MAX_TOKENS = 4096

#: The largest ``max_tokens`` the SDK sends without streaming: above it (a request that
#: might take over ten minutes at its assumed speed, 128,000 tokens an hour) it raises
#: ``ValueError`` and asks for streaming. A packed request's cap is its callers' caps
#: added up and can pass it; it is lowered to this (a reply that long is never needed).
NONSTREAMING_MAX_TOKENS = 128_000 * 10 // 60

_STOPPED = frozenset({"end_turn", "tool_use", "stop_sequence"})


def nonstreaming_cap(model: str) -> int:
    """The largest ``max_tokens`` the SDK accepts for ``model`` without streaming: its
    own per-model limit (``anthropic._constants.MODEL_NONSTREAMING_TOKENS``) where it
    has one, else :data:`NONSTREAMING_MAX_TOKENS`."""
    try:
        from ._sdk_anthropic import MODEL_NONSTREAMING_TOKENS
    except ImportError:  # an SDK without the table: the general limit
        return NONSTREAMING_MAX_TOKENS
    limit: int = MODEL_NONSTREAMING_TOKENS.get(model, NONSTREAMING_MAX_TOKENS)
    return min(NONSTREAMING_MAX_TOKENS, limit)


def finish_reason(stop_reason: str | None) -> str:
    """Anthropic's ``stop_reason`` in OpenAI's words.

    ``end_turn``, ``tool_use`` and ``stop_sequence`` become ``"stop"``, ``max_tokens``
    becomes ``"length"``; anything else (``refusal``, ``pause_turn``...) is kept.

    Args:
        stop_reason: The message's ``stop_reason``.
    """
    if stop_reason is None or stop_reason in _STOPPED:
        return "stop"
    if stop_reason == "max_tokens":
        return "length"
    return stop_reason


#: The shortest prefix each model family caches (Anthropic's prompt-caching docs);
#: the first match wins, and models not listed are taken to need 1,024 tokens.
CACHE_MINIMUMS = (
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
)
#: Cache reads cost a tenth of the input price on every Anthropic model.
CACHE_READ_PRICE = 0.1


def _usage(usage: Any, output_tokens: int | None = None) -> Usage:
    """``input_tokens`` counts every prompt token, cached ones included (as OpenAI does)."""
    cache_read = getattr(usage, "cache_read_input_tokens", None) or 0
    cache_write = getattr(usage, "cache_creation_input_tokens", None) or 0
    fresh = getattr(usage, "input_tokens", None) or 0
    if output_tokens is None:
        output_tokens = getattr(usage, "output_tokens", None) or 0
    return Usage(fresh + cache_read + cache_write, output_tokens, cache_read, cache_write)


class AnthropicProvider(SDKProvider["anthropic.AsyncAnthropic"]):
    """Messages through an ``anthropic.AsyncAnthropic`` client.

    The client is copied with ``max_retries=0`` (yours is left as it is) so the SDK's
    retries never multiply with coalesce's.

    Args:
        client: The SDK client.
        default_max_tokens: ``max_tokens`` when the request sets no cap.
        name: The provider's name in statistics.
        enforces_schema: Whether replies are held to the tool's schema. Default
            ``False``: a forced tool's input is not guaranteed to follow its schema,
            so streamed answers are held until the reply ends.
        prompt_cache: Mark each request's shared prefix (the tool and the system
            prompt) with ``cache_control``, so that it is cached where it is long
            enough (see :data:`CACHE_MINIMUMS`). Default ``True``.
    """

    sdk = "anthropic"
    #: A reply that is not streamed arrives parsed (the tool's ``input`` object), so a
    #: key the model repeated is gone before coalesce sees it; coalesce then asks for a
    #: list of results (wire format 1), where a repeated id stays visible.
    parsed_replies = True

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        name: str = "anthropic",
        enforces_schema: bool = False,
        prompt_cache: bool = True,
    ) -> None:
        super().__init__(client)
        self.name = name
        self.enforces_schema = enforces_schema
        self.caches = prompt_cache
        self.default_max_tokens = default_max_tokens

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        """Send ``request``; stream it if ``request.stream``.

        Streamed, both text deltas and the forced tool's ``partial_json`` deltas go to
        ``on_text``, so an incremental parser sees the JSON as it is written.

        Args:
            request: The request.
            on_text: Receives each delta of a streamed reply.

        Raises:
            anthropic.APIStatusError: An error answer (``RateLimitError``, 529...).
            anthropic.APIConnectionError: The connection failed or dropped.
            anthropic.APITimeoutError: The request timed out.
        """
        collector = Collector(on_text)
        raw = await self.client.messages.with_raw_response.create(**self.arguments(request))
        headers = lower_headers(raw.headers.items())
        parsed = await raw.parse()  # a Message, or an AsyncStream of events
        if request.stream:
            import anthropic

            async with parsed as stream:
                with sdk_transport_errors(anthropic, raw.http_response.request):
                    return await _read_stream(stream, collector, headers)
        return _completion(parsed, collector, headers, request.reply_schema is not None)

    #: Which batch API serves this provider's deferred lane.
    batch_api = "anthropic"

    def prompt_cache(self, model: str) -> PromptCache | None:
        """How ``model``'s prompt prefixes are cached, when requests mark them.

        Args:
            model: The model name.
        """
        if not self.caches:
            return None
        name = model.rsplit("/", 1)[-1]
        minimum = next((n for prefix, n in CACHE_MINIMUMS if name.startswith(prefix)), 1024)
        return PromptCache(min_tokens=minimum, read_price=CACHE_READ_PRICE)

    def arguments(self, request: CompletionRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request``.

        With a ``cache_key``, the system prompt is marked with ``cache_control``: the
        tool and the instructions before it are then cached where they are long
        enough (a shorter prefix is sent uncached, at no extra cost).

        Args:
            request: The request.
        """
        system: Any = request.system
        if request.cache_key is not None and self.caches and system:
            system = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        args: dict[str, Any] = {
            **request.options,
            "model": request.model,
            "system": system,
            "messages": [{"role": "user", "content": request.user}],
            "max_tokens": self.default_max_tokens
            if request.max_output_tokens is None
            else request.max_output_tokens,
        }
        if not request.stream:
            args["max_tokens"] = min(args["max_tokens"], nonstreaming_cap(request.model))
        if request.reply_schema is not None:
            args["tools"] = [anthropic_tool(request.reply_schema, name=request.schema_name)]
            args["tool_choice"] = {"type": "tool", "name": request.schema_name}
        if request.stream:
            args["stream"] = True
        return args

    def __repr__(self) -> str:
        return f"<AnthropicProvider base_url={str(self._client.base_url)!r}>"


def _completion(
    message: Any, collector: Collector, headers: dict[str, str], tool: bool
) -> Completion:
    tools = [block for block in message.content if block.type == "tool_use"]
    if tool and tools:
        text = json.dumps(tools[0].input, ensure_ascii=False)
    else:  # no schema, or the model answered in prose instead of calling the tool
        text = "".join(block.text for block in message.content if block.type == "text")
    return Completion(
        text=text,
        finish_reason=finish_reason(message.stop_reason),
        usage=_usage(message.usage),
        seconds=collector.elapsed(),
        headers=headers,
        reply={"id": message.id, "model": message.model},
    )


class _StreamState:
    """What a message stream has said so far, besides the text."""

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self.start_usage: Any = None
        self.output_tokens: int | None = None
        self.reply: dict[str, Any] = {}

    def see(self, event: Any, collector: Collector) -> None:
        kind = event.type
        if kind == "message_start":
            self.start_usage = event.message.usage
            self.reply = {"id": event.message.id, "model": event.message.model}
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                collector.add(delta.text)
            elif delta.type == "input_json_delta":
                collector.add(delta.partial_json)
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            # The delta's output_tokens is the running total, not an increment.
            self.output_tokens = event.usage.output_tokens


async def _read_stream(stream: Any, collector: Collector, headers: dict[str, str]) -> Completion:
    state = _StreamState()
    async for event in stream:
        state.see(event, collector)
    return Completion(
        text=collector.text,
        finish_reason=finish_reason(state.stop_reason),
        usage=None if state.start_usage is None else _usage(state.start_usage, state.output_tokens),
        ttft=collector.ttft,
        seconds=collector.elapsed(),
        headers=headers,
        reply=state.reply,
    )

"""The one seam between coalesce and an LLM provider.

A provider sends one :class:`CompletionRequest` (a packed multi-item prompt, already
built) and returns one :class:`Completion` (the raw reply text, why it stopped, the
usage). Everything else (packing, splitting, re-asking, planning) is the provider's
caller's job, so a fake provider for a test is a few lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Completion",
    "CompletionRequest",
    "Provider",
    "RetryAdvice",
    "Usage",
]


@dataclass(frozen=True)
class CompletionRequest:
    """One request to send.

    Attributes:
        model: The provider's model name.
        system: The shared instructions (sent first, once, as the system prompt).
        user: The user message (for a packed request, the JSON array of items).
        reply_schema: JSON schema the reply must follow, for providers with
            structured output (OpenAI ``response_format`` ``json_schema``, Anthropic
            a forced tool); ``None`` to ask for plain text.
        schema_name: Name to give the schema / tool.
        max_output_tokens: Cap on the reply's tokens, or ``None`` for the default.
        stream: Whether to stream the reply (text deltas go to ``on_text``).
        options: Further request options passed through unchanged (temperature...).
        cache_key: A stable name for the request's shared prefix (the instructions and
            the reply format), or ``None``. A provider with a prompt cache uses it:
            OpenAI as ``prompt_cache_key``, Anthropic by marking the system prompt
            with ``cache_control``.
    """

    model: str
    system: str
    user: str
    reply_schema: Mapping[str, Any] | None = None
    schema_name: str = "coalesce_results"
    max_output_tokens: int | None = None
    stream: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    cache_key: str | None = None


@dataclass(frozen=True)
class Usage:
    """Tokens a request consumed, as the provider reported them.

    Attributes:
        input_tokens: Every prompt token, cached and cache-written ones included.
        output_tokens: Reply tokens.
        cached_input_tokens: Prompt tokens read from the provider's prompt cache.
        cache_write_tokens: Prompt tokens written to the cache (Anthropic bills them
            above the input price).
    """

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(frozen=True)
class Completion:
    """One reply.

    Attributes:
        text: The reply's text (for a forced Anthropic tool, the tool input as JSON).
        finish_reason: ``"stop"``, ``"length"`` (truncated by the token cap), or the
            provider's own value for anything else.
        usage: Token usage, if the provider reported it.
        ttft: Seconds from sending to the first text, when streamed.
        seconds: Seconds from sending to the end of the reply.
        headers: Response headers (lower-case names), for rate-limit information.
        reply: What the provider said about the reply besides its content (``id``,
            ``model``, and OpenAI's ``created``, ``system_fingerprint``,
            ``service_tier``), as far as it said.
    """

    text: str
    finish_reason: str
    usage: Usage | None = None
    ttft: float | None = None
    seconds: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    reply: Mapping[str, Any] = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        """Whether the reply was cut off by the output-token cap."""
        return self.finish_reason in ("length", "max_tokens")


@dataclass(frozen=True)
class RetryAdvice:
    """What to do about an exception raised by :meth:`Provider.complete`.

    Attributes:
        retry: Whether sending the same request again may succeed (429, 5xx,
            timeouts, dropped connections).
        after: Seconds the provider asked us to wait (``retry-after``), if it said.
        headers: The error response's headers (lower-case names), if there was one:
            a 429 carries the quota that refused the request.
    """

    retry: bool
    after: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Provider(Protocol):
    """Sends one request to an LLM. Implementations live in ``coalesce.providers``."""

    #: A short name for statistics and messages ("openai", "anthropic", ...).
    name: str
    #: Whether ``reply_schema`` constrains the reply (structured output); if not,
    #: the format is described in the prompt and the reply parsed tolerantly.
    structured: bool
    # Optional: ``parsed_replies = True`` says that a reply that is not streamed reaches
    # ``Completion.text`` re-encoded from a parsed object (as a forced tool's input
    # does), so a key repeated by the model is lost; such requests then ask for wire
    # format 1 (a list of results). Not part of the protocol, so older providers still
    # match it; absent means false.
    # Optional: ``enforces_schema = True`` says that every reply follows
    # ``reply_schema`` (strict structured outputs, a grammar): an id is never written
    # twice, so a streamed answer can be handed over the moment it is complete. Absent
    # means false: answers are held until the reply ends.
    # Optional: ``prompt_cache(model) -> PromptCache | None`` says how the provider
    # caches prompt prefixes for ``model`` (its minimum length, its price), for the
    # decision whether packing pays. Absent: learned from the replies' cached tokens.

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        """Send ``request`` and return the reply.

        When ``request.stream`` is true and the provider can stream, ``on_text`` is
        called with each text delta as it arrives, before this returns.

        Raises:
            Exception: The provider's own exception types (for example
                ``openai.RateLimitError``), unchanged.
        """
        ...

    def advise(self, error: BaseException) -> RetryAdvice:
        """Whether ``error`` (raised by :meth:`complete`) is worth retrying, and when."""
        ...

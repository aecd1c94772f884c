"""Prompt caching as the providers document it: what a request offers, and the arithmetic.

A request is read into a :class:`CacheRequest`: its blocks (:class:`Segment`) in the
provider's cache order. The decisions are pure functions of explicit state:
:func:`openai_cached` (OpenAI: the longest prefix seen before, in 128-token steps from
1,024) and :func:`plan_breakpoints` (Anthropic: prefixes up to ``cache_control``
breakpoints). The state itself, entries and their lifetimes, lives in ``_cache_store``.

The cache order:

- OpenAI: the ``response_format`` schema first (OpenAI's docs: "the structured output
  schema serves as a prefix to the system message"), then the messages in order.
- Anthropic: ``tools``, then ``system``, then ``messages``.

Each message's first block carries the three framing tokens the simulator counts per
message; the three tokens that prime the reply come last and are never cached.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from coalesce.exceptions import ConfigurationError

from ._fields import content_texts
from ._http import HttpError

__all__ = [
    "DEFAULT_MIN_TOKENS",
    "Breakpoints",
    "CacheRequest",
    "Counter",
    "Segment",
    "SimulatedPromptCache",
    "anthropic_cache_request",
    "boundary_tokens",
    "common_prefix",
    "openai_cache_request",
    "openai_cached",
    "plan_breakpoints",
    "prefix_tokens",
    "serialize",
    "without_cache_control",
]

#: The shortest prefix each model caches where it differs from 1,024 tokens
#: (Anthropic's prompt-caching docs; the same table as ``coalesce``'s provider).
DEFAULT_MIN_TOKENS: Mapping[str, int] = MappingProxyType(
    {
        "claude-opus-4-5": 4096,
        "claude-haiku-4-5": 4096,
        "claude-3-5-haiku": 2048,
        "claude-3-haiku": 2048,
    }
)

#: Anthropic accepts at most this many ``cache_control`` breakpoints per request.
MAX_BREAKPOINTS = 4

_PER_MESSAGE = 3  # the framing tokens :func:`coalesce.testing._engine.prompt_tokens` counts


#: Counts the tokens of one text.
Counter = Callable[[str], int]


@dataclass(frozen=True)
class SimulatedPromptCache:
    """How the simulated provider caches prompt prefixes.

    OpenAI caches every prompt of at least the model's minimum, and reports the
    longest prefix shared with an earlier prompt (same API key, model and
    ``prompt_cache_key``) in ``increment`` steps. Anthropic caches only prefixes that
    end at a ``cache_control`` breakpoint and are at least the model's minimum long.
    An entry becomes usable once its request's first token is out (a concurrent
    request with the same prefix misses, as the providers document) and lives ``ttl``
    seconds from its last use.

    Attributes:
        ttl: Seconds an entry lives after its last use, before the provider's
            ``time_scale`` (5 minutes, as both providers).
        min_tokens: The shortest cached prefix per model name; a name also matches
            its dated variants, the longest prefix winning. Entries are added to, and
            take precedence over, :data:`DEFAULT_MIN_TOKENS`.
        default_min_tokens: The shortest cached prefix of any other model.
        increment: OpenAI reports cached tokens in steps of this many past the minimum.
        lookback: Anthropic: how many block boundaries before a breakpoint are
            checked for an earlier entry.

    Raises:
        ConfigurationError: A value is out of range.
    """

    ttl: float = 300.0
    min_tokens: Mapping[str, int] = field(default_factory=dict)
    default_min_tokens: int = 1024
    increment: int = 128
    lookback: int = 20

    def __post_init__(self) -> None:
        if not self.ttl > 0:
            raise ConfigurationError(f"prompt cache ttl must be > 0 seconds, got {self.ttl}")
        for name, value in [
            ("default_min_tokens", self.default_min_tokens),
            *self.min_tokens.items(),
        ]:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"prompt cache minimum for {name!r} must be a positive number of tokens,"
                    f" got {value!r}"
                )
        if self.increment < 1 or self.lookback < 0:
            raise ConfigurationError(
                f"prompt cache increment ({self.increment}) must be >= 1 and lookback"
                f" ({self.lookback}) >= 0"
            )

    def minimum_for(self, model: str) -> int:
        """Return the shortest prefix ``model`` caches."""
        table = {**DEFAULT_MIN_TOKENS, **self.min_tokens}
        if model in table:
            return table[model]
        prefixes = [name for name in table if model.startswith(name)]
        return table[max(prefixes, key=len)] if prefixes else self.default_min_tokens


@dataclass(frozen=True)
class Segment:
    """One block of a prompt, in the provider's cache order.

    Attributes:
        head: What must match besides the text (the role at a message's start).
        text: The block's text, whose tokens count.
        extra: Tokens the API adds for the block (a message's framing).
        mark: Anthropic: a ``cache_control`` breakpoint ends here.
    """

    head: str
    text: str
    extra: int = 0
    mark: bool = False


@dataclass(frozen=True)
class CacheRequest:
    """What one request offers the prompt cache.

    Attributes:
        segments: The prompt's blocks in cache order.
        automatic: Cached without breakpoints, by longest prefix (OpenAI).
        key: OpenAI's ``prompt_cache_key``: only requests with the same key share.
    """

    segments: tuple[Segment, ...] = ()
    automatic: bool = False
    key: str | None = None


# ---------------------------------------------------------------- reading requests


def without_cache_control(value: Any) -> Any:
    """Return a tool definition (anything else as it is) without its ``cache_control``
    (not part of the prompt)."""
    if isinstance(value, Mapping) and "cache_control" in value:
        return {k: v for k, v in value.items() if k != "cache_control"}
    return value


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, list) and content:
        return content
    return [{"type": "text", "text": content} if isinstance(content, str) else {}]


def _marked(block: Any) -> bool:
    control = block.get("cache_control") if isinstance(block, Mapping) else None
    if control is None:
        return False
    if not isinstance(control, Mapping) or control.get("type") != "ephemeral":
        raise HttpError(400, f"cache_control must be {{'type': 'ephemeral'}}, got {control!r}")
    return True


def _message_segments(messages: Sequence[Mapping[str, Any]], *, marks: bool) -> Iterator[Segment]:
    for message in messages:
        role = str(message.get("role"))
        for index, block in enumerate(_blocks(message.get("content"))):
            text = "".join(content_texts([block]))
            head, extra = (role, _PER_MESSAGE) if index == 0 else ("+", 0)
            yield Segment(head, text, extra, marks and _marked(block))


def openai_cache_request(
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    schema: Mapping[str, Any] | None,
) -> CacheRequest:
    """Return what a Chat Completions request offers the cache: every prompt block, the
    ``response_format`` ``schema`` first, in the scope of the body's ``prompt_cache_key``.

    Raises:
        HttpError: ``prompt_cache_key`` is not a string.
    """
    key = body.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        raise HttpError(400, f"'prompt_cache_key' must be a string, got {key!r}")
    head = [Segment("schema", json.dumps(schema))] if schema is not None else []
    return CacheRequest((*head, *_message_segments(messages, marks=False)), True, key)


def anthropic_cache_request(
    body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]
) -> CacheRequest:
    """Return what a Messages request offers the cache: tools, system, messages.

    Raises:
        HttpError: A ``cache_control`` is not ``{"type": "ephemeral"}``, or there are
            more than four of them.
    """
    tools = body.get("tools")
    segments = [
        Segment("tool", json.dumps(without_cache_control(tool)), 0, _marked(tool))
        for tool in (tools if isinstance(tools, list) else [])
    ]
    system = body.get("system")
    if system is not None:
        segments += [
            Segment("system", "".join(content_texts([block])), 0, _marked(block))
            for block in _blocks(system)
        ]
    segments += _message_segments(messages, marks=True)
    marks = sum(segment.mark for segment in segments)
    if marks > MAX_BREAKPOINTS:
        raise HttpError(
            400,
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided."
            f" Found {marks}.",
        )
    return CacheRequest(tuple(segments))


# -------------------------------------------------------------------- the arithmetic


def serialize(segments: Sequence[Segment]) -> str:
    """Return the blocks as one string whose prefixes are the prompt's prefixes."""
    return "".join(f"\x1e{segment.head}\x1f{segment.text}" for segment in segments)


def common_prefix(a: str, b: str) -> int:
    """Return the length of the longest common prefix of ``a`` and ``b``."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # slices compare in C: log n comparisons beat a loop over characters
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def prefix_tokens(segments: Sequence[Segment], chars: int, count: Counter) -> int:
    """Return the tokens of the first ``chars`` characters of :func:`serialize`'s string:
    a block counts its framing once its head is in the prefix, and the tokens of the part
    of its text that is."""
    tokens, start = 0, 0
    for segment in segments:
        text_start = start + len(segment.head) + 2
        if chars < text_start:
            break
        end = text_start + len(segment.text)
        tokens += segment.extra + count(segment.text[: chars - text_start])
        if chars < end:
            break
        start = end
    return tokens


def boundary_tokens(segments: Sequence[Segment], count: Counter, limit: int) -> list[int]:
    """Return the tokens of the prompt up to the end of each block, at most ``limit`` (the
    prompt's tokens: a prefix never counts more)."""
    totals, running = [], 0
    for segment in segments:
        running += segment.extra + count(segment.text)
        totals.append(min(running, limit))
    return totals


def openai_cached(common: int, minimum: int, increment: int) -> int:
    """Return OpenAI's ``cached_tokens`` for a prefix of ``common`` tokens seen before, at
    least ``minimum`` (1,024) in steps of ``increment`` (128)."""
    if common < minimum:
        return 0
    return minimum + increment * ((common - minimum) // increment)


class Breakpoints(NamedTuple):
    """What an Anthropic request reads from and writes to the cache.

    Attributes:
        read: ``cache_read_input_tokens``.
        written: ``cache_creation_input_tokens``.
        hit: The block boundary read from, if any.
        store: The boundaries whose prefixes are written or refreshed.
    """

    read: int
    written: int
    hit: int | None
    store: tuple[int, ...]


def plan_breakpoints(
    tokens: Sequence[int],
    marks: Sequence[int],
    cached: Collection[int],
    minimum: int,
    lookback: int,
) -> Breakpoints:
    """Return what a request with breakpoints reads and writes; pure.

    Breakpoints whose prefix is shorter than ``minimum`` are ignored. The longest
    cached prefix ending at a breakpoint, or at a boundary at most ``lookback`` blocks
    before one, is read; the rest up to the last breakpoint is written.

    Args:
        tokens: The prompt's tokens up to the end of each block.
        marks: The blocks that end at a breakpoint.
        cached: The boundaries whose prefix has a live cache entry.
        minimum: The model's shortest cached prefix.
        lookback: How far before a breakpoint to look for an entry.
    """
    eligible = tuple(b for b in marks if tokens[b] >= minimum)
    if not eligible:
        return Breakpoints(0, 0, None, ())
    window = {j for b in eligible for j in range(max(0, b - lookback), b + 1)}
    hit = max((j for j in window if j in cached), default=None)
    read = tokens[hit] if hit is not None else 0
    return Breakpoints(read, max(0, tokens[max(eligible)] - read), hit, eligible)

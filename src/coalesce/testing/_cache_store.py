"""The prompt cache's state: entries, when they become usable, and when they expire.

A request is looked up first (:meth:`PromptCacheStore.lookup`, which decides what it
reads and writes), then committed once its latency is known
(:meth:`PromptCacheStore.commit`): what it writes becomes usable when its first token
is out, and lives the TTL from its last use.

OpenAI's prompts are kept sorted per (API key, model, ``prompt_cache_key``): the
longest prefix a prompt shares with any kept prompt is shared with one of its two
neighbours in that order (the nearest live one on each side), so a lookup costs a
binary search and two comparisons. Anthropic's prefixes are kept by digest.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import NamedTuple

from ._cache import (
    CacheRequest,
    Counter,
    SimulatedPromptCache,
    boundary_tokens,
    common_prefix,
    openai_cached,
    plan_breakpoints,
    prefix_tokens,
    serialize,
)
from ._clock import Clock

__all__ = ["CacheUse", "PromptCacheStore"]


@dataclass(frozen=True)
class Entry:
    """One cached prefix: usable from ``ready_at`` until before ``expires_at``."""

    ready_at: float
    expires_at: float

    def live(self, at: float) -> bool:
        """Whether the entry can be read at ``at``."""
        return self.ready_at <= at < self.expires_at

    def touched(self, at: float, ready_at: float, ttl: float) -> Entry:
        """Return the entry after a request at ``at`` wrote or read it: usable from
        ``ready_at`` (its first token out), living ``ttl`` (scaled) from then."""
        if self.live(at):  # read: a use refreshes it
            return Entry(self.ready_at, max(self.expires_at, at + ttl))
        if self.ready_at > at:  # still being written by an earlier request
            return Entry(min(self.ready_at, ready_at), max(self.expires_at, ready_at + ttl))
        return Entry(ready_at, ready_at + ttl)  # expired: written afresh


def _new(ready_at: float, ttl: float) -> Entry:
    return Entry(ready_at, ready_at + ttl)


#: OpenAI's entries are shared within (API key, model, ``prompt_cache_key``).
PromptScope = tuple[str, str, "str | None"]
#: An Anthropic prefix: (API key, model, digest of the prefix).
PrefixKey = tuple[str, str, bytes]


class CacheUse(NamedTuple):
    """What one request reads from and writes to the cache.

    Attributes:
        read: Prompt tokens read from the cache.
        written: Prompt tokens written to it (Anthropic only; OpenAI does not bill them).
        prompts: OpenAI: the prompts the request writes or refreshes.
        prefixes: Anthropic: the prefixes the request writes or refreshes.
    """

    read: int = 0
    written: int = 0
    prompts: tuple[tuple[PromptScope, str], ...] = ()
    prefixes: tuple[PrefixKey, ...] = ()


class _Lookup(NamedTuple):
    """One request's lookup, as :meth:`PromptCacheStore.lookup` takes it."""

    request: CacheRequest
    scope: tuple[str, str]
    prompt_tokens: int
    at: float
    count: Counter


class _Prompts:
    """OpenAI prompts of one (API key, model, cache key), sorted."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.entries: dict[str, Entry] = {}

    def nearest(self, text: str, at: float, prune_at: float) -> tuple[int, str | None]:
        """The longest prefix ``text`` shares with a live prompt, and that prompt."""
        start = bisect_left(self.texts, text)
        after = self._walk(start, 1, at, prune_at)  # first: the left side's indices stay
        before = self._walk(start - 1, -1, at, prune_at)
        shared = [(common_prefix(text, other), other) for other in (before, after) if other]
        return max(shared, default=(0, None))

    def _walk(self, index: int, step: int, at: float, prune_at: float) -> str | None:
        while 0 <= index < len(self.texts):
            other = self.texts[index]
            entry = self.entries[other]
            if entry.expires_at <= prune_at:  # gone for good
                del self.texts[index], self.entries[other]
                index += min(step, 0)
                continue
            if entry.live(at):
                return other
            index += step  # not usable yet: look past it
        return None

    def touch(self, text: str, at: float, ready_at: float, ttl: float) -> None:
        entry = self.entries.get(text)
        if entry is None:
            insort(self.texts, text)
            self.entries[text] = _new(ready_at, ttl)
        else:
            self.entries[text] = entry.touched(at, ready_at, ttl)

    def prune(self, now: float) -> None:
        self.entries = {t: e for t, e in self.entries.items() if e.expires_at > now}
        self.texts = [t for t in self.texts if t in self.entries]


class PromptCacheStore:
    """Every cached prefix of one provider.

    Args:
        config: How to cache, or ``None``: nothing is ever cached.
        time_scale: The provider's time scale (multiplies the TTL).
        clock: The provider's clock; entries expired by its time are forgotten.
    """

    def __init__(self, config: SimulatedPromptCache | None, time_scale: float, clock: Clock):
        self.config = config
        self.ttl = (config.ttl if config else 0.0) * time_scale
        self.clock = clock
        self.prompts: dict[PromptScope, _Prompts] = {}
        self.prefixes: dict[PrefixKey, Entry] = {}
        self._prune_above = 256

    def lookup(
        self,
        request: CacheRequest,
        scope: tuple[str, str],
        prompt_tokens: int,
        at: float,
        count: Counter,
    ) -> CacheUse:
        """Return what a request processed ``at`` reads and would write (entries are scoped to
        ``scope``, its ``(api_key, model)``); the store is not changed."""
        config = self.config
        if config is None or not request.segments:
            return CacheUse()
        ask = _Lookup(request, scope, prompt_tokens, at, count)
        return self._automatic(config, ask) if request.automatic else self._breakpoints(config, ask)

    def _automatic(self, config: SimulatedPromptCache, ask: _Lookup) -> CacheUse:
        request, prompt_tokens, at = ask.request, ask.prompt_tokens, ask.at
        minimum = config.minimum_for(ask.scope[1])
        key: PromptScope = (*ask.scope, request.key)
        text = serialize(request.segments)
        prompts = self.prompts.get(key)
        chars, other = (0, None) if prompts is None else prompts.nearest(text, at, self._now(at))
        common = min(prefix_tokens(request.segments, chars, ask.count), prompt_tokens)
        read = openai_cached(common, minimum, config.increment)
        touched = [other] if read and other is not None else []
        if prompt_tokens >= minimum:
            touched.append(text)
        return CacheUse(read, 0, prompts=tuple((key, t) for t in touched))

    def _breakpoints(self, config: SimulatedPromptCache, ask: _Lookup) -> CacheUse:
        request = ask.request
        marks = [i for i, segment in enumerate(request.segments) if segment.mark]
        if not marks:
            return CacheUse()
        tokens = boundary_tokens(request.segments, ask.count, ask.prompt_tokens)
        keys: list[PrefixKey] = [(*ask.scope, digest) for digest in _digests(request)]
        live = {i for i, key in enumerate(keys) if self._live(key, ask.at)}
        minimum = config.minimum_for(ask.scope[1])
        plan = plan_breakpoints(tokens, marks, live, minimum, config.lookback)
        touched = [*plan.store, *([plan.hit] if plan.hit is not None else [])]
        return CacheUse(plan.read, plan.written, prefixes=tuple(keys[i] for i in touched))

    def _live(self, key: PrefixKey, at: float) -> bool:
        entry = self.prefixes.get(key)
        return entry is not None and entry.live(at)

    def commit(self, use: CacheUse, at: float, ready_at: float) -> None:
        """Write or refresh the entries of a request being answered (see :meth:`lookup`)."""
        for scope, text in use.prompts:
            self.prompts.setdefault(scope, _Prompts()).touch(text, at, ready_at, self.ttl)
        for key in use.prefixes:
            entry = self.prefixes.get(key)
            self.prefixes[key] = (
                _new(ready_at, self.ttl) if entry is None else entry.touched(at, ready_at, self.ttl)
            )
        self._prune(at)

    def _now(self, at: float) -> float:
        """The time entries are forgotten by: never later than the clock's (a batch line
        is looked up at its future finish, when a live request may still use them)."""
        return min(at, self.clock.now())

    def _prune(self, at: float) -> None:
        size = len(self.prefixes) + sum(len(p.entries) for p in self.prompts.values())
        if size <= self._prune_above:
            return
        now = self._now(at)
        self.prefixes = {k: e for k, e in self.prefixes.items() if e.expires_at > now}
        for prompts in self.prompts.values():
            prompts.prune(now)
        self.prompts = {k: p for k, p in self.prompts.items() if p.entries}
        size = len(self.prefixes) + sum(len(p.entries) for p in self.prompts.values())
        self._prune_above = max(256, 2 * size)


def _digests(request: CacheRequest) -> list[bytes]:
    """A digest of the prompt up to the end of each block (a chain: each covers all before)."""
    digests, running = [], hashlib.sha256()
    for segment in request.segments:
        running.update(serialize([segment]).encode("utf-8", "surrogatepass"))
        digests.append(running.copy().digest())
    return digests

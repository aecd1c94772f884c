"""Simulated latency: time to first token, then decoding at a steady rate.

The pure function :func:`compute_delays` turns a profile and token counts into the
delays; the app only sleeps them (through ``anyio.sleep``, so virtual time works).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from coalesce.exceptions import ConfigurationError

__all__ = ["Delays", "LatencyProfile", "SimulatedLatency", "compute_delays", "pace"]


@dataclass(frozen=True)
class LatencyProfile:
    """How fast one model answers.

    Attributes:
        ttft: Seconds before the first token, whatever the prompt.
        prompt_token_seconds: Extra seconds to first token per prompt token (not
            per token read from the prompt cache).
        tokens_per_second: Decoding speed once the first token is out.
    """

    ttft: float = 0.4
    prompt_token_seconds: float = 0.00005
    tokens_per_second: float = 80.0

    def __post_init__(self) -> None:
        if self.ttft < 0 or self.prompt_token_seconds < 0:
            raise ConfigurationError(
                f"latency ttft ({self.ttft}) and prompt_token_seconds"
                f" ({self.prompt_token_seconds}) must be >= 0"
            )
        if self.tokens_per_second <= 0:
            raise ConfigurationError(
                f"latency tokens_per_second must be > 0, got {self.tokens_per_second}"
            )


@dataclass(frozen=True)
class SimulatedLatency:
    """How long the simulated provider takes to answer: latency profiles per model name.

    Not to be confused with ``coalesce``'s own latency model, which *learns* a
    provider's latency from what it observes; this one *produces* it.

    Attributes:
        default: The profile of any model not named in ``models``.
        models: Profiles by model name; a name also matches its dated variants
            (``"gpt-4o"`` matches ``"gpt-4o-2024-08-06"``), the longest prefix winning.
        jitter: Relative spread of every delay: ``0.1`` draws a factor in
            ``[0.9, 1.1)`` per request from the provider's seeded generator.
    """

    default: LatencyProfile = field(default_factory=LatencyProfile)
    models: Mapping[str, LatencyProfile] = field(default_factory=dict)
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.jitter < 1:
            raise ConfigurationError(f"latency jitter must be in [0, 1), got {self.jitter}")

    def profile_for(self, model: str) -> LatencyProfile:
        """Return the profile of ``model``."""
        if model in self.models:
            return self.models[model]
        prefixes = [name for name in self.models if model.startswith(name)]
        return self.models[max(prefixes, key=len)] if prefixes else self.default


class Delays(NamedTuple):
    """The delays of one answer, in (scaled) seconds.

    Attributes:
        first_token: From the request to the first token.
        decode: From the first token to the last.
    """

    first_token: float
    decode: float

    @property
    def total(self) -> float:
        """From the request to the last token."""
        return self.first_token + self.decode


def compute_delays(
    profile: LatencyProfile,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    time_scale: float = 1.0,
    jitter: float = 0.0,
    noise: float = 0.5,
    cached_tokens: int = 0,
) -> Delays:
    """Return the delays of an answer; pure, no clock involved.

    Args:
        profile: The model's latency profile.
        prompt_tokens: Tokens of the whole prompt.
        completion_tokens: Tokens of the answer.
        time_scale: Multiplies every delay (``0.001`` runs a thousand times faster).
        jitter: Relative spread, see :attr:`SimulatedLatency.jitter`.
        noise: A draw in ``[0, 1)``; ``0.5`` means no jitter at all.
        cached_tokens: Prompt tokens read from the prompt cache: their prefill is
            free, so they add nothing to the time to first token.
    """
    factor = (1.0 + jitter * (2.0 * noise - 1.0)) * time_scale
    prefilled = max(0, prompt_tokens - cached_tokens)
    first = (profile.ttft + profile.prompt_token_seconds * prefilled) * factor
    decode = completion_tokens / profile.tokens_per_second * factor
    return Delays(first, decode)


def pace(decode: float, weights: Sequence[int]) -> list[float]:
    """Split the ``decode`` seconds over stream chunks in proportion to their sizes."""
    total = sum(weights)
    if total <= 0:
        return [0.0 for _ in weights]
    return [decode * weight / total for weight in weights]

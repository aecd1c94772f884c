"""How long each answer is: a fixed target, a seeded long tail, or any callable."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from coalesce.exceptions import ConfigurationError

from ._model import canonical_json, fraction

__all__ = ["LongTail", "OutputTokens", "target_tokens"]

#: The target length of an item's answer in tokens: fixed, or a function of the item.
OutputTokens: TypeAlias = "int | Callable[[Any], int] | None"


@dataclass(frozen=True)
class LongTail:
    """Answer lengths drawn from a log-normal distribution, one per item input.

    The draw is a pure function of the seed and the item, so an item always gets
    the same length: most answers are near ``median``, a few are much longer.

    Attributes:
        median: The median length in tokens.
        sigma: Spread of the logarithm; 1.0 gives a long tail (p99 near 10x median).
        minimum: The shortest length.
        maximum: The longest length.
        seed: Changes every draw.
    """

    median: int = 40
    sigma: float = 1.0
    minimum: int = 1
    maximum: int = 4000
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.median <= self.maximum or self.sigma < 0:
            raise ConfigurationError(
                "LongTail needs 0 < minimum <= median <= maximum and sigma >= 0,"
                f" got {self.minimum}, {self.median}, {self.maximum}, sigma={self.sigma}"
            )

    def __call__(self, item_input: Any) -> int:
        """Return the target length of ``item_input``'s answer."""
        draw = fraction(canonical_json(item_input), f"long-tail/{self.seed}")
        z = statistics.NormalDist().inv_cdf(min(max(draw, 1e-9), 1 - 1e-9))
        length = round(self.median * math.exp(self.sigma * z))
        return min(self.maximum, max(self.minimum, length))


def target_tokens(spec: OutputTokens, item_input: Any) -> int | None:
    """Return the target length of one item's answer under ``spec``: ``None`` (no padding),
    a fixed length, or a callable of the item."""
    if spec is None:
        return None
    if isinstance(spec, int):
        return spec
    return int(spec(item_input))

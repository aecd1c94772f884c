"""Packing degradation: answers that get worse as more items share one prompt.

Real models answer packed items less well as the group grows and as an item sits
further down the prompt (issue 15's measurements; BatchPrompt, ICLR 2024). A
:class:`PackingDegradation` makes the simulated model do the same: each item of a
packed request is answered wrongly (:func:`degraded_output`, valid under the schema)
with a chance that grows with the group's size and the item's position. The verdict
is drawn from a hash of the seed, the item, the group's size and the position, so it
is the same on every run and whatever the order of the requests. A plain request is
never degraded: it is the reference the packed answers are measured against.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coalesce.exceptions import ConfigurationError

from ._length import OutputTokens, target_tokens
from ._model import canonical_json, expected_output, fraction

__all__ = ["PackingDegradation", "degrade_results", "degraded_output"]

_WORD = re.compile(r"[a-z]+")
#: Redraws tried before concluding that the schema allows one answer only.
_ATTEMPTS = 64

_CHANCES = {
    "base": "the chance of every item of a group larger than free_items",
    "per_extra_item": "the chance added per item beyond free_items",
    "per_position": "the chance added per position down the prompt",
}


@dataclass(frozen=True)
class PackingDegradation:
    """How packing worsens the simulated model's answers.

    An item at ``position`` (0 for the first item written in the prompt) of a packed
    request of ``size`` items is answered wrongly with the chance
    :meth:`probability`: 0 when ``size <= free_items``, otherwise
    ``min(1, base + per_extra_item * (size - free_items) + per_position * position)``.

    Attributes:
        base: Chance of a wrong answer for every item of a group larger than
            ``free_items``, from 0 to 1.
        per_extra_item: Chance added for each item beyond ``free_items``, from 0 to 1.
        per_position: Chance added for each position down the prompt, from 0 to 1.
        free_items: The largest group answered as well as a plain call (default 1: a
            group of one is never degraded; 0 degrades groups of one too).
        seed: Seed of the verdicts: another seed, other items answered wrongly.

    Raises:
        ConfigurationError: A chance is not a number from 0 to 1, ``free_items`` is
            not a whole number >= 0, or ``seed`` not a whole number.
    """

    base: float = 0.0
    per_extra_item: float = 0.0
    per_position: float = 0.0
    free_items: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name, meaning in _CHANCES.items():
            _check_chance(name, getattr(self, name), meaning)
        if not _whole(self.free_items) or self.free_items < 0:
            raise ConfigurationError(
                "PackingDegradation.free_items must be a whole number >= 0 (the largest"
                f" group answered as well as a plain call), got {self.free_items!r}"
            )
        if not _whole(self.seed):
            raise ConfigurationError(
                f"PackingDegradation.seed must be a whole number, got {self.seed!r}"
            )

    def probability(self, size: int, position: int) -> float:
        """Return the chance that the item at ``position`` of ``size`` is answered wrongly.

        Args:
            size: Items in the packed request.
            position: The item's place in the prompt, 0 for the first.
        """
        if size <= self.free_items:
            return 0.0
        extra = size - self.free_items
        return min(1.0, self.base + self.per_extra_item * extra + self.per_position * position)

    def degrades(self, item_input: Any, size: int, position: int) -> bool:
        """Whether the item is answered wrongly at ``position`` of a group of ``size``.

        Args:
            item_input: The item, any JSON-able value.
            size: Items in the packed request.
            position: The item's place in the prompt, 0 for the first.
        """
        chance = self.probability(size, position)
        if chance <= 0.0:
            return False
        key = canonical_json([self.seed, size, position, item_input])
        return fraction(key, "packing-degradation") < chance


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_chance(name: str, value: Any, meaning: str) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and 0 <= value <= 1):
        raise ConfigurationError(
            f"PackingDegradation.{name} must be a number from 0 to 1 ({meaning}), got {value!r}"
        )


def degraded_output(
    item_input: Any, schema: Mapping[str, Any] | None = None, *, output_tokens: int | None = None
) -> Any:
    """Return the wrong answer a degraded packed request gives to ``item_input``.

    It is another draw of the same schema (so it validates as the right one does),
    different from :func:`expected_output`, and as long: an enum answers another
    member, a number another number, a string other text (no word of its padding in
    the right answer: a wrong summary is not the right one reworded), an object other
    values. Only a schema that allows one answer (a ``const``, an enum of one) has
    no wrong answer: then this is the right one, and the item counts as not degraded.

    Args:
        item_input: The item, any JSON-able value.
        schema: JSON schema of one item's output, as for :func:`expected_output`.
        output_tokens: Target length, as for :func:`expected_output`.
    """
    right = expected_output(item_input, schema, output_tokens=output_tokens)
    return _wrong(item_input, schema, right, output_tokens)


def _wrong(
    item_input: Any, schema: Mapping[str, Any] | None, right: Any, tokens: int | None
) -> Any:
    words = set(_WORD.findall(canonical_json(right)))
    for attempt in range(_ATTEMPTS):
        other = {"degraded": item_input, "attempt": attempt}
        candidate = expected_output(other, schema, output_tokens=tokens, avoid=words)
        if candidate != right:
            return candidate
    return right


def degrade_results(
    results: list[dict[str, Any]],
    inputs: Sequence[Any],
    schema: Mapping[str, Any] | None,
    degradation: PackingDegradation | None,
    lengths: OutputTokens = None,
) -> tuple[list[dict[str, Any]], int]:
    """Replace the outputs that ``degradation`` makes wrong in a packed reply.

    Args:
        results: ``[{"id": ..., "output": ...}, ...]`` in prompt order, right answers.
        inputs: Each result's item, in the same order.
        schema: The JSON schema of one item's output, if any.
        degradation: How packing worsens answers; ``None``: not at all.
        lengths: Target answer length per item, as the provider's ``output_tokens``.

    Returns:
        The results, some of them wrong, and how many are.
    """
    if degradation is None:
        return results, 0
    size = len(results)
    out: list[dict[str, Any]] = []
    for position, (result, item_input) in enumerate(zip(results, inputs, strict=True)):
        if degradation.degrades(item_input, size, position):
            tokens = target_tokens(lengths, item_input)
            result = {**result, "output": _wrong(item_input, schema, result["output"], tokens)}
        out.append(result)
    wrong = sum(new["output"] != old["output"] for new, old in zip(out, results, strict=True))
    return out, wrong

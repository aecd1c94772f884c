"""OpenAI's flex processing: ``service_tier="flex"`` is slower, and sometimes refused.

:class:`FlexProcessing` is the configuration; :class:`FlexSource` decides each flex
request's fate (the next scripted entry first, then a seeded draw), as
:class:`~coalesce.testing.FaultSource` does for faults. A refusal is OpenAI's
``429`` with the code ``resource_unavailable``: flex capacity is gone for now, and
the request is not billed.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from coalesce.exceptions import ConfigurationError

from ._flavour import Flavour, error_body

__all__ = ["FLEX_UNAVAILABLE", "FlexProcessing", "FlexSource"]

#: The error code of a flex request refused for lack of capacity.
FLEX_UNAVAILABLE = "resource_unavailable"


@dataclass(frozen=True)
class FlexProcessing:
    """How flex requests (OpenAI ``service_tier="flex"``) are served.

    Attributes:
        latency_factor: Multiplies a flex request's whole latency (time to first
            token and decoding), on top of ``time_scale``.
        unavailable: Chance that a flex request is refused with ``429``
            ``resource_unavailable`` (a seeded draw per flex request).
        script: One entry per flex request, consumed in order before any draw:
            ``True`` refuses it, ``False`` serves it.
        seed: Seed of the draws.
        models: The models that offer flex; a flex request for another one is
            refused with ``400``. ``None`` (the default): every model.
    """

    latency_factor: float = 3.0
    unavailable: float = 0.05
    script: Sequence[bool] = ()
    seed: int = 0
    models: Collection[str] | None = None

    def __post_init__(self) -> None:
        if not self.latency_factor > 0:
            raise ConfigurationError(
                f"flex latency_factor must be > 0, got {self.latency_factor!r}"
            )
        if not 0 <= self.unavailable <= 1:
            raise ConfigurationError(
                f"flex unavailable is a probability from 0 to 1, got {self.unavailable!r}"
            )
        _check_script(self.script)


def _check_script(entries: Sequence[Any]) -> None:
    for entry in entries:
        if not isinstance(entry, bool):
            raise ConfigurationError(
                f"a flex script entry is True (refuse) or False (serve), got {entry!r}"
            )


class FlexSource:
    """Decides each flex request's fate: scripted entries first, then draws."""

    def __init__(self, plan: FlexProcessing) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self._script: deque[bool] = deque(plan.script)

    def inject(self, *refusals: bool) -> None:
        """Script the next flex requests: ``True`` refuses one, ``False`` serves it.

        Raises:
            ConfigurationError: An entry is not a bool.
        """
        _check_script(refusals)
        self._script.extend(refusals)

    @property
    def pending(self) -> int:
        """How many scripted entries are still to be consumed."""
        return len(self._script)

    def slowdown(self, tier: str | None) -> float:
        """Return the latency factor of a request served in ``tier``."""
        return self.plan.latency_factor if tier == "flex" else 1.0

    def refusal(
        self, flavour: Flavour, tier: str | None, model: str
    ) -> tuple[int, dict[str, Any]] | None:
        """Return the error a request in service ``tier`` is refused with, or ``None``.

        Only flex requests are ever refused; each one consumes a script entry or a
        draw (unless its model offers no flex at all).
        """
        if tier != "flex":
            return None
        if self.plan.models is not None and model not in self.plan.models:
            body = error_body(flavour, 400, _unsupported(model, self.plan.models))
            body["error"]["param"] = "service_tier"
            return 400, body
        refused = (
            self._script.popleft() if self._script else self.rng.random() < self.plan.unavailable
        )
        if not refused:
            return None
        body = error_body(flavour, 429, _unavailable(model))
        body["error"]["code"] = FLEX_UNAVAILABLE
        return 429, body


def _unavailable(model: str) -> str:
    return (
        f"Resource unavailable: flex processing has no capacity for {model} right now."
        " Retry later with backoff, or send the request without service_tier='flex'"
        " (default processing). Refused flex requests are not billed."
    )


def _unsupported(model: str, models: Collection[str]) -> str:
    return (
        f"Flex processing is not available for the model {model!r}; it is for"
        f" {sorted(models)}. Send the request without service_tier='flex'."
    )

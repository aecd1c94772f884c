"""Which lane a call takes: real time, flex or a batch job. Pure.

Each lane promises an answer by some time, at some price (the table in
``docs/lanes.md``). With ``lane="auto"``, a call goes to the cheapest lane whose
promise fits inside its budget, counting the time a deferred call waits to be
collected. A call without a budget stays in real time: nobody said it may wait. A lane
the provider lacks (Anthropic has no flex) is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from .._engine.spec import LANE_CHOICES, Lane, check_lane_choice
from .._exceptions import ConfigurationError

# Lane and LANE_CHOICES are defined with the option they name (``Options.lane``).
__all__ = [
    "FLEX_RETRIES",
    "LANE_CHOICES",
    "Lane",
    "LaneTimes",
    "check_lane",
    "choose_lane",
    "flex_again",
]

#: Most times a call flex refused for capacity is asked in flex again (a call without
#: a deadline too) before it goes to real time.
FLEX_RETRIES = 4


@dataclass(frozen=True)
class LaneTimes:
    """By when each deferred lane promises an answer, in seconds after a call.

    Attributes:
        flex: OpenAI's flex processing: slower than real time, and it may refuse with
            429 when capacity is short (then the call falls back to real time). OpenAI
            advises a client timeout of 15 minutes.
        batch: The batch APIs' completion window (24 h for both providers). Most jobs
            finish much sooner, but only the window is promised.
        collect: How long a deferred call waits for company: the batch lane's next
            job, or the flex lane's next group (``batch_window``).
    """

    flex: float = 15 * 60.0
    batch: float = 24 * 3600.0
    collect: float = 60.0

    def __post_init__(self) -> None:
        for name in ("flex", "batch", "collect"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ConfigurationError(f"LaneTimes.{name} must be seconds >= 0, got {value!r}")


def check_lane(lane: object, supported: Collection[Lane]) -> str:
    """``lane`` if it is a lane name the provider supports, else a clear error.

    Raises:
        ConfigurationError: Not one of :data:`LANE_CHOICES` (the rule of
            :func:`~coalesce._engine.spec.check_lane_choice`), or a lane the provider
            does not offer.
    """
    lane = check_lane_choice(lane)
    if lane != "auto" and Lane(lane) not in supported:
        offered = ", ".join(repr(each.value) for each in Lane if each in supported)
        raise ConfigurationError(
            f"lane={lane!r} is not offered by this provider (it offers {offered});"
            " use lane='auto' to take the cheapest lane it offers"
        )
    return lane


def choose_lane(
    lane: str, budget: float | None, supported: Collection[Lane], times: LaneTimes
) -> Lane:
    """The lane of one call: from the function's ``lane=`` option (checked by
    :func:`check_lane`), the call's ``budget`` in seconds (or ``None``), the lanes the
    provider offers (``supported``; real time always) and when each deferred lane
    promises an answer (``times``)."""
    if lane != "auto":
        return Lane(lane)
    if budget is None:
        return Lane.REALTIME
    if Lane.BATCH in supported and budget >= times.batch + times.collect:
        return Lane.BATCH
    if Lane.FLEX in supported and budget >= times.flex + times.collect:
        return Lane.FLEX
    return Lane.REALTIME


def flex_again(left: float, delay: float, refusals: int, times: LaneTimes) -> bool:
    """Whether a call flex refused for capacity ``refusals`` times may be asked in flex
    again after waiting ``delay`` seconds: at most :data:`FLEX_RETRIES` times, and only
    while the budget then left (of ``left`` now, ``inf`` without a deadline) still
    covers flex's promise and its window (``times``), the rule by which
    :func:`choose_lane` sent it there."""
    return refusals <= FLEX_RETRIES and left - delay >= times.flex + times.collect

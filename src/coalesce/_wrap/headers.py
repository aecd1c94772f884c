"""coalesce's own ``x-coalesce*`` headers of an SDK call: split off, checked, read.

A caller steers one call through ``extra_headers``: ``x-coalesce: off`` sends it
alone, untouched; ``x-coalesce-budget`` gives it a budget; ``x-coalesce-partition``
names its partition; ``x-coalesce-lane`` its lane (``auto``, ``realtime``, ``flex``,
``batch``). They are removed before anything is sent.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .._engine.spec import LANE_CHOICES
from .._exceptions import ConfigurationError
from .call import given_arguments

__all__ = [
    "BUDGET_HEADER",
    "HEADERS",
    "LANE_HEADER",
    "PARTITION_HEADER",
    "SWITCH_HEADER",
    "CallHeaders",
    "coalesce_headers",
    "without_headers",
]

#: ``extra_headers={"x-coalesce": "off"}`` sends that call alone, untouched.
SWITCH_HEADER = "x-coalesce"
#: ``extra_headers={"x-coalesce-budget": "0.5"}`` gives that call a 0.5 s budget.
BUDGET_HEADER = "x-coalesce-budget"
#: ``extra_headers={"x-coalesce-partition": "tenant-42"}``: calls with different values
#: never share a prompt.
PARTITION_HEADER = "x-coalesce-partition"
#: ``extra_headers={"x-coalesce-lane": "batch"}``: that call's lane (see docs/lanes.md).
LANE_HEADER = "x-coalesce-lane"
#: Every header coalesce reads (and removes before the call is sent).
HEADERS = (SWITCH_HEADER, BUDGET_HEADER, PARTITION_HEADER, LANE_HEADER)


@dataclass(frozen=True)
class CallHeaders:
    """What one call asked of coalesce through its ``x-coalesce*`` headers.

    Attributes:
        coalesce: ``False`` for ``x-coalesce: off`` (the call goes to the client alone).
        budget: Seconds the call may wait (``x-coalesce-budget``), if given.
        partition: The call's partition (``x-coalesce-partition``), if given: calls
            with different partitions never share a prompt.
        lane: The lane it asked for (``x-coalesce-lane``), if given: one of
            :data:`~coalesce._engine.spec.LANE_CHOICES`.
    """

    coalesce: bool = True
    budget: float | None = None
    partition: str | None = None
    lane: str | None = None


_NONE = CallHeaders()  # what a call without coalesce headers asks (frozen: shared)


def coalesce_headers(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], CallHeaders]:
    """Split the coalesce headers off ``extra_headers`` and check them.

    Returns the keyword arguments without them (``extra_headers`` dropped when nothing
    else is left in it) and what they asked.

    Args:
        kwargs: Keyword arguments of an SDK method.

    Raises:
        ConfigurationError: A header starting with ``x-coalesce`` that is not one of
            :data:`HEADERS`, given twice, or with a value its header does not accept.
    """
    headers = kwargs.get("extra_headers")
    if not isinstance(headers, Mapping):
        return dict(kwargs), _NONE
    ours = {k: v for k, v in headers.items() if _is_ours(k)}
    if not ours:
        return dict(kwargs), _NONE
    return without_headers(kwargs, ours), _read_headers(ours)


def without_headers(kwargs: Mapping[str, Any], names: Collection[str]) -> dict[str, Any]:
    """``kwargs`` with the headers ``names`` taken out of its ``extra_headers`` (dropped
    when nothing else is left in it)."""
    cleaned = dict(kwargs)
    rest = {k: v for k, v in cleaned["extra_headers"].items() if k not in names}
    if rest:
        cleaned["extra_headers"] = rest
    else:
        del cleaned["extra_headers"]
    return cleaned


def _is_ours(name: Any) -> bool:
    return isinstance(name, str) and name.lower().split("-", 2)[:2] == ["x", "coalesce"]


def _read_headers(ours: Mapping[str, Any]) -> CallHeaders:
    found: dict[str, Any] = {}
    for name, value in ours.items():
        key = name.lower()
        if key not in HEADERS:
            raise ConfigurationError(
                f"unknown coalesce header {name!r}; the headers are {', '.join(HEADERS)}"
            )
        if key in found:
            raise ConfigurationError(f"the {key} header is given twice; give it once")
        found[key] = value
    found = given_arguments(found)
    return CallHeaders(
        coalesce=_word(found.get(SWITCH_HEADER), SWITCH_HEADER, ("on", "off")) != "off",
        budget=_seconds(found.get(BUDGET_HEADER)),
        partition=_partition(found.get(PARTITION_HEADER)),
        lane=_word(found.get(LANE_HEADER), LANE_HEADER, LANE_CHOICES),
    )


def _word(value: Any, header: str, words: tuple[str, ...]) -> str | None:
    """The header's word, one of ``words`` in any case (``None``: not given)."""
    if value is None:
        return None
    word = value.strip().lower() if isinstance(value, str) else None
    if word not in words:
        allowed = {
            SWITCH_HEADER: "'on' or 'off' (this call alone, untouched)",
            LANE_HEADER: f"one of {', '.join(words)}",
        }[header]
        raise ConfigurationError(f"the {header} header must be {allowed}, got {value!r}")
    return word


def _seconds(value: Any) -> float | None:
    """The budget header's seconds: a positive, finite number (or its text)."""
    if value is None:
        return None
    try:
        seconds = float(value) if isinstance(value, (str, int, float)) else math.nan
    except (ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        raise ConfigurationError(
            f"the {BUDGET_HEADER} header must be a positive, finite number of seconds such"
            f" as '0.5', got {value!r}"
        )
    return seconds


def _partition(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"the {PARTITION_HEADER} header must be a non-empty string naming the call's"
            f" partition (a tenant, a user, a trust level), got {value!r}"
        )
    return value

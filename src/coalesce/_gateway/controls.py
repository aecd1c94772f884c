"""The headers a client steers one call with, and the headers its reply tells it by.

A call may carry ``x-coalesce-budget`` (seconds), ``x-coalesce-lane`` (``auto`` or
``realtime``; ``flex`` and ``batch`` are refused until ``coalesce.wrap`` takes a lane per
call), ``x-coalesce-partition`` and ``x-coalesce: off``.
The gateway reads the lane itself and hands the others to ``coalesce.wrap`` as the
call's ``extra_headers``, where :func:`~coalesce._wrap.headers.coalesce_headers` reads
them (one set of rules for the SDK and the gateway: the same values are valid, the same
errors name them). The reply carries ``x-coalesce-group-size``,
``x-coalesce-request-id`` and ``x-coalesce-lane`` where they are known. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._engine.spec import LANE_CHOICES
from .._exceptions import ConfigurationError
from .._wrap.headers import HEADERS, coalesce_headers

__all__ = [
    "GROUP_SIZE_HEADER",
    "LANE_HEADER",
    "OFFERED_LANES",
    "REQUEST_ID_HEADER",
    "SERVED_LANES",
    "Controls",
    "read_controls",
    "reply_headers",
    "served_lane",
]

#: ``x-coalesce-lane: flex``: which lane the call may take (``auto`` by default).
LANE_HEADER = "x-coalesce-lane"
#: In a reply: how many calls shared the upstream request that answered this one.
GROUP_SIZE_HEADER = "x-coalesce-group-size"
#: In a reply: the upstream request that answered this one (the provider's reply id).
REQUEST_ID_HEADER = "x-coalesce-request-id"
#: The lanes the gateway answers in today: ``coalesce.wrap`` coalesces in real time only.
OFFERED_LANES = frozenset({"realtime"})
#: The lanes a call (or the gateway's default) may ask for: ``auto`` is the cheapest
#: offered lane the budget allows, which is real time. A call asking for ``flex`` or
#: ``batch`` is refused rather than answered at real-time prices.
SERVED_LANES = ("auto", "realtime")


@dataclass(frozen=True)
class Controls:
    """What one call asked of the gateway through its ``x-coalesce*`` headers.

    Attributes:
        lane: The lane it asked for (``x-coalesce-lane``), else the gateway's default.
        budget: Its budget in seconds (``x-coalesce-budget``), else the default, if any.
        forwarded: The headers ``coalesce.wrap`` reads (``x-coalesce``,
            ``x-coalesce-budget``, ``x-coalesce-partition``), as the client sent them.
        coalesce: ``False`` for ``x-coalesce: off``: the call goes upstream alone.
    """

    lane: str
    budget: float | None
    forwarded: Mapping[str, str]
    coalesce: bool = True


def read_controls(
    headers: Iterable[tuple[str, str]], *, budget: float | None, lane: str
) -> Controls:
    """Read and check a call's ``x-coalesce*`` headers.

    Args:
        headers: The request's headers, as ``(name, value)`` pairs (a name may repeat).
        budget: The gateway's default budget, if any.
        lane: The gateway's default lane.

    Raises:
        ConfigurationError: An unknown ``x-coalesce*`` header, one given twice, or a
            value its header does not accept (the message names it and what is valid).
    """
    ours: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if not key.startswith("x-coalesce"):
            continue
        if key in ours:
            raise ConfigurationError(f"the {key} header is given twice; give it once")
        ours[key] = value
    chosen = ours.pop(LANE_HEADER, None)
    unknown = sorted(set(ours) - set(HEADERS))
    if unknown:
        known = ", ".join((*HEADERS, LANE_HEADER))
        raise ConfigurationError(f"unknown coalesce header {unknown[0]!r}; the headers are {known}")
    _, asked = coalesce_headers({"extra_headers": ours})
    return Controls(
        lane=lane if chosen is None else _lane(chosen),
        budget=asked.budget if asked.budget is not None else budget,
        forwarded=ours,
        coalesce=asked.coalesce,
    )


def _lane(value: str) -> str:
    word = value.strip().lower()
    if word not in LANE_CHOICES:
        raise ConfigurationError(
            f"the {LANE_HEADER} header must be one of {', '.join(LANE_CHOICES)}, got {value!r}"
        )
    if word not in SERVED_LANES:
        raise ConfigurationError(unserved_lane(f"the {LANE_HEADER} header", word))
    return word


def unserved_lane(what: str, lane: str) -> str:
    """Why ``what`` (a header, a setting) may not ask for ``lane`` (flex or batch)."""
    return (
        f"{what} asks for the {lane} lane, which coalesce serve does not support yet: it"
        f" answers in real time only. Send {' or '.join(SERVED_LANES)} (or leave it out),"
        f" or run the {lane} work in process with coalesce.prompt(lane={lane!r})"
    )


def served_lane(asked: str, offered: frozenset[str] = OFFERED_LANES) -> str:
    """The lane a call asking for ``asked`` is answered in: that lane where the gateway
    offers it, else real time; ``auto`` is the cheapest offered lane the budget allows,
    which with real time alone is real time."""
    if asked in offered:
        return asked
    return "realtime"


def reply_headers(*, lane: str, group_size: int | None, request_id: str | None) -> dict[str, str]:
    """The ``x-coalesce-*`` headers of a reply: what is known of how it was answered."""
    headers = {LANE_HEADER: lane}
    if group_size is not None:
        headers[GROUP_SIZE_HEADER] = str(group_size)
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    return headers

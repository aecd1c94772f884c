"""The headers a client steers one call with, and the headers its reply tells it by.

A call may carry ``x-coalesce-budget`` (seconds), ``x-coalesce-lane`` (``auto``,
``realtime``, ``flex``, ``batch``), ``x-coalesce-partition`` and ``x-coalesce: off``.
The gateway hands them to ``coalesce.wrap`` as the call's ``extra_headers``, where
:func:`~coalesce._wrap.headers.coalesce_headers` reads them (one set of rules for the
SDK and the gateway: the same values are valid, the same errors name them); a call
without ``x-coalesce-lane`` takes the gateway's ``--lane``, ``wrap``'s ``lane=``. The
reply carries ``x-coalesce-group-size``, ``x-coalesce-request-id`` and
``x-coalesce-lane`` (the lane that answered: ``wrap`` tells it on its raw response)
where they are known. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._exceptions import ConfigurationError
from .._wrap.headers import HEADERS, coalesce_headers

__all__ = [
    "GROUP_SIZE_HEADER",
    "LANE_HEADER",
    "OFFERED_LANES",
    "REQUEST_ID_HEADER",
    "Controls",
    "read_controls",
    "reply_headers",
    "served_lane",
]

#: ``x-coalesce-lane: flex``: which lane the call may take (the gateway's ``--lane`` by
#: default); in a reply, the lane that answered it.
LANE_HEADER = "x-coalesce-lane"
#: In a reply: how many calls shared the upstream request that answered this one.
GROUP_SIZE_HEADER = "x-coalesce-group-size"
#: In a reply: the upstream request that answered this one (the provider's reply id).
REQUEST_ID_HEADER = "x-coalesce-request-id"
#: The lanes the gateway answers in (``coalesce.wrap``'s: Anthropic has no flex, and
#: refuses it by name).
OFFERED_LANES = frozenset({"realtime", "flex", "batch"})


@dataclass(frozen=True)
class Controls:
    """What one call asked of the gateway through its ``x-coalesce*`` headers.

    Attributes:
        lane: The lane it asked for (``x-coalesce-lane``), else the gateway's default.
        budget: Its budget in seconds (``x-coalesce-budget``), else the default, if any.
        forwarded: The headers ``coalesce.wrap`` reads (``x-coalesce``,
            ``x-coalesce-budget``, ``x-coalesce-partition``, ``x-coalesce-lane``), as
            the client sent them.
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
    unknown = sorted(set(ours) - set(HEADERS))
    if unknown:
        known = ", ".join(HEADERS)
        raise ConfigurationError(f"unknown coalesce header {unknown[0]!r}; the headers are {known}")
    _, asked = coalesce_headers({"extra_headers": ours})
    return Controls(
        lane=lane if asked.lane is None else asked.lane,
        budget=asked.budget if asked.budget is not None else budget,
        forwarded=ours,
        coalesce=asked.coalesce,
    )


def served_lane(asked: str, offered: frozenset[str] = OFFERED_LANES) -> str:
    """The lane a call asking for ``asked`` is counted in until its reply says which
    answered it (``x-coalesce-lane`` on ``wrap``'s raw response): that lane where the
    gateway offers it, else real time (``auto``, and a call passed through)."""
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

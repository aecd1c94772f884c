"""The endpoints about the simulator itself: ``GET /`` and ``/_sim/...``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from starlette.responses import Response

from coalesce.exceptions import ConfigurationError

from ._call import Call
from ._faults import FaultSource
from ._flex import FlexSource
from ._http import HttpError

__all__ = ["expire_batch", "inject", "inject_flex", "reset", "root", "stats"]


async def root(call: Call) -> Response:
    """``GET /``: what this server is, so a script can wait for it."""
    return call.reply(
        {
            "name": "coalesce simulated provider",
            "status": "ok",
            "time_scale": call.sim.time_scale,
            "apis": [
                "/v1/chat/completions",
                "/v1/responses",
                "/v1/files",
                "/v1/batches",
                "/v1/messages",
                "/v1/messages/batches",
            ],
            "admin": [
                "/_sim/stats",
                "/_sim/reset",
                "/_sim/faults",
                "/_sim/flex",
                "/_sim/batches/expire",
            ],
        }
    )


async def stats(call: Call) -> Response:
    """``GET /_sim/stats``: the totals, every request's record and every batch created."""
    ledger = call.sim.ledger
    return call.reply(
        {
            "totals": ledger.statistics().as_dict(),
            "requests": [record.as_dict() for record in ledger.records()],
            "batches": [batch.as_dict() for batch in call.sim.batches.submissions()],
        }
    )


async def reset(call: Call) -> Response:
    """``POST /_sim/reset``: forget requests, usage, batches and scripted faults."""
    call.sim.reset()
    return call.reply({"reset": True})


async def inject(call: Call) -> Response:
    """``POST /_sim/faults``: script the faults of the next requests.

    Raises:
        HttpError: The body is not ``{"script": [...]}`` or names an unknown fault.
    """
    usage = "one entry (null, a fault or a list) per request"
    return _script(call, call.sim.faults, usage)


async def inject_flex(call: Call) -> Response:
    """``POST /_sim/flex``: script the next flex requests (``true`` refuses one).

    Raises:
        HttpError: The body is not ``{"script": [true, false, ...]}``.
    """
    return _script(call, call.sim.flex, "true (refuse) or false (serve) per flex request")


def _script(call: Call, source: FaultSource | FlexSource, usage: str) -> Response:
    """Script ``source`` with the body's ``script``; answer how many entries wait."""
    script = call.json_object().get("script")
    if not isinstance(script, list):
        raise HttpError(400, f'send {{"script": [...]}}: {usage}')
    with _refused():
        source.inject(*script)
    return call.reply({"pending": source.pending})


async def expire_batch(call: Call) -> Response:
    """``POST /_sim/batches/expire``: the next batch stops after ``after_lines`` lines and
    expires at the end of its completion window.

    Raises:
        HttpError: The body is not ``{"after_lines": n}`` with ``n >= 0``.
    """
    after = call.json_object().get("after_lines", 0)
    with _refused():
        call.sim.batches.stall_next(after)
    return call.reply({"after_lines": after})


@contextmanager
def _refused() -> Iterator[None]:
    """A value the simulator refuses is the client's error: ``400`` with the reason."""
    try:
        yield
    except ConfigurationError as exc:
        raise HttpError(400, str(exc)) from None

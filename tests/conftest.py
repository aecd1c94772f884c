"""Shared fixtures.

Every behavioural test runs twice, on asyncio and on trio, through the anyio pytest
plugin. Both backends run on *virtual time*: trio's ``MockClock`` with
``autojump_threshold=0`` and, on asyncio, a ``looptime`` event loop. Time advances
only when every task is blocked, so a 30 s window is tested in microseconds and
assertions on times are exact.

Tests that talk to a real socket (a server over loopback) must not run on virtual
time; they use the ``real_time_backend`` fixture instead (see below).
"""

from __future__ import annotations

from typing import Any

import looptime
import pytest
from hypothesis import HealthCheck, settings
from trio.testing import MockClock

settings.register_profile(
    "ci",
    database=None,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci")


def _virtual_asyncio_loop() -> Any:
    return looptime.new_event_loop(noop_cycles=1)


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both backends, each on virtual time."""
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0)})
    return ("asyncio", {"loop_factory": _virtual_asyncio_loop})


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def real_time_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both backends on the real clock, for tests that do real I/O.

    Use it in a module with ``anyio_backend = real_time_backend``-style override::

        @pytest.fixture
        def anyio_backend(real_time_backend):
            return real_time_backend
    """
    return (str(request.param), {})


@pytest.fixture(autouse=True)
def _sdk_platform_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Detect the SDKs' platform inline, not in a worker thread.

    On a client's first request (and every copy's, ``with_options`` included) the
    openai and anthropic SDKs call ``get_platform`` through ``asyncify``, a worker
    thread. Under a virtual clock, time jumps ahead whenever every task is blocked,
    waiting on that thread included, so the request being sent falls behind by however
    far the clock jumped: a group planned to the edge of its budget then arrives late
    (rarely, on trio, whose scheduling order is random). The call is a few platform
    lookups; inline it costs nothing.
    """
    import anthropic._base_client
    import openai._base_client

    def inline(function: Any) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(openai._base_client, "asyncify", inline)
    monkeypatch.setattr(anthropic._base_client, "asyncify", inline)

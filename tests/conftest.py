"""Shared fixtures.

Every behavioural test runs twice, on asyncio and on trio, through the anyio pytest
plugin. Both backends run on *virtual time*: trio's ``MockClock`` with
``autojump_threshold=0`` and, on asyncio, a ``looptime`` event loop. Time advances
only when every task is blocked, so a 30 s window is tested in microseconds and
assertions on times are exact.

Worker threads (the job store's SQLite work runs in ``anyio.to_thread``) take no
virtual time: on trio the clock does not jump while one is running (see
``_patient_with_threads``).

Tests that talk to a real socket (a server over loopback) must not run on virtual
time; they use the ``real_time_backend`` fixture instead (see below).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio.to_thread
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


#: Real seconds a worker thread may run before the trio clock jumps anyway.
_THREAD_PATIENCE = 2.0


def _patient_with_threads(clock: MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``clock`` hold still while a worker thread runs (``anyio.to_thread``).

    A task waiting on a thread counts as blocked, so with ``autojump_threshold=0`` the
    clock jumps to the next deadline at once, and again and again for as long as the
    thread works: poll loops then run thousands of virtual hours in a busy loop that
    holds the GIL, and the thread (which needs the GIL between its SQLite statements)
    crawls. While a thread runs the threshold is raised to ``_THREAD_PATIENCE`` real
    seconds instead, so the thread's work takes no virtual time, as on a fast machine;
    a thread that waits on virtual time itself still gets it after that long.
    """
    run_sync = anyio.to_thread.run_sync
    running = [0]

    async def patient_run_sync(func: Any, *args: Any, **kwargs: Any) -> Any:
        running[0] += 1
        clock.autojump_threshold = _THREAD_PATIENCE
        try:
            return await run_sync(func, *args, **kwargs)
        finally:
            running[0] -= 1
            if not running[0]:
                clock.autojump_threshold = 0

    monkeypatch.setattr(anyio.to_thread, "run_sync", patient_run_sync)


def _virtual_asyncio_loop() -> Any:
    return looptime.new_event_loop(noop_cycles=1)


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, dict[str, Any]]:
    """Both backends, each on virtual time."""
    if request.param == "trio":
        clock = MockClock(autojump_threshold=0)
        _patient_with_threads(clock, monkeypatch)
        return ("trio", {"clock": clock})
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
def _own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test keeps what coalesce persists (learned group caps, the batch lane's job
    store) in a directory of its own (``$COALESCE_STORE``'s), never the user's, so no
    test starts from what another one learned."""
    monkeypatch.setenv("COALESCE_STORE", str(tmp_path / "store" / "jobs.sqlite3"))


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

"""The fleet's fixtures: a real NATS server (``_nats.py``), the simulated provider over
HTTP recording what reaches it, and gateways in front of it joined as one fleet, served
by uvicorn in threads as tests/gateway serves one.

nats-py runs on asyncio only, and sockets do not run on virtual time: these tests run
on asyncio's real clock. None of them measures time: each waits for what it needs
(a lease held, a reply) and asserts on what happened.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "gateway"))  # _serving, _traffic

from _nats import NatsServer
from _serving import Recorder

from coalesce.testing import SimulatedProvider
from coalesce.testing._server import ServerThread


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "jetstream")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sim() -> SimulatedProvider:
    # A quarter of the simulated latency: these tests assert on who answered what, not
    # on time, and a run of tests/fleet is kept short.
    return SimulatedProvider(time_scale=0.25)


@pytest.fixture
def recorder(sim: SimulatedProvider) -> Recorder:
    return Recorder(sim)


@pytest.fixture
def sim_url(recorder: Recorder) -> Iterator[str]:
    with ServerThread(recorder, "127.0.0.1", 0) as url:
        yield url

"""The gateway's fixtures: the simulated provider over HTTP (recording what reaches it),
and the gateway in front of it, served by uvicorn in a thread (``_serving.py``).

Sockets do not run on virtual time: these tests run on the real clock
(``real_time_backend``), as tests/integrations do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _serving import Recorder, Running, gateway_config, serving

from coalesce.testing import SimulatedProvider
from coalesce.testing._server import ServerThread


@pytest.fixture
def anyio_backend(real_time_backend: Any) -> Any:
    return real_time_backend


@pytest.fixture
def sim() -> SimulatedProvider:
    # Half the simulated latency, as tests/integrations: the budget has room for a
    # loaded machine, and the grouping is still the planner's.
    return SimulatedProvider(time_scale=0.5)


@pytest.fixture
def recorder(sim: SimulatedProvider) -> Recorder:
    return Recorder(sim)


@pytest.fixture
def sim_url(recorder: Recorder) -> Iterator[str]:
    with ServerThread(recorder, "127.0.0.1", 0) as url:
        yield url


@pytest.fixture
async def gateway(sim_url: str) -> AsyncIterator[Running]:
    async with serving(gateway_config(sim_url)) as running:
        yield running

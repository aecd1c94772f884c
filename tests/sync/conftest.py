"""The fixtures of the tests of synchronous callers and ``map``: the simulator, in
process and over HTTP (helpers: ``_threads.py``).

Threads and sockets do not run on virtual time: those tests use the real clock and a
fast simulator (``time_scale``); their assertions count requests and check answers,
never times. The groups are made full by count (``max_items=10``, 40 calls, a long
``max_wait``), so the number of requests does not depend on how the threads are
scheduled. ``map`` runs on virtual time (the ``anyio_backend`` fixture).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coalesce.testing import SimulatedProvider


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(time_scale=0.02)


@pytest.fixture
def url(sim: SimulatedProvider) -> Iterator[str]:
    with sim.serve() as base_url:
        yield base_url

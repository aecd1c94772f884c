"""The fixtures of the framework tests: the simulator over HTTP and the wrapped clients.

The task and the checks they share are in ``_integration.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest
from _integration import CALLS

import coalesce
from coalesce.testing import SimulatedProvider


@pytest.fixture
def anyio_backend(real_time_backend: Any) -> Any:
    return real_time_backend


@pytest.fixture
def sim() -> SimulatedProvider:
    # Real time, on a shared 2-core CI machine: at its default speed the simulator's
    # latency plus the machine's own (the frameworks, the server thread, other tests)
    # left Anthropic's groups of 4 a few hundredths of a second inside the 2 s budget,
    # and a loaded run missed it. At half the simulated latency the budget has room for
    # the machine; the grouping is still the planner's, learned from the replies.
    return SimulatedProvider(time_scale=0.5)


#: The wrapped clients' budget. The issue's figures are measured at 2 s by
#: benchmarks/bench_frameworks.py; here the calls run in real time on a shared CI machine,
#: where a cold function's probe can itself take most of 2 s, and the tests check
#: structure and delivery (each caller its own answer, at most 10 requests for 40), not
#: latency.
BUDGET = 5.0


@pytest.fixture
def url(sim: SimulatedProvider) -> Iterator[str]:
    with sim.serve() as base_url:
        yield base_url


@pytest.fixture
async def openai_client(sim: SimulatedProvider, url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """An ``AsyncOpenAI`` on the simulator, wrapped as a user would wrap it."""
    raw = sim.openai_client(url)
    async with coalesce.wrap(raw, latency_budget=BUDGET, max_items=CALLS // 2) as client:
        yield client


@pytest.fixture
async def anthropic_client(
    sim: SimulatedProvider, url: str
) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """An ``AsyncAnthropic`` on the simulator, wrapped as a user would wrap it."""
    raw = sim.anthropic_client(url)
    async with coalesce.wrap(raw, latency_budget=BUDGET, max_items=CALLS // 2) as client:
        yield client

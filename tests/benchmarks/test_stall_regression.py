"""bench_trust closes every SDK client it makes (the faults scenario's 60 s stall).

In full runs of ``bench_trust.py --scenario faults``, some requests of the row "wrap
anthropic, stream=True, schema_enforced=True" never saw their reply and waited out the
60 s attempt timeout. The provider had sent it: the request's socket had simply lost its
registration with the event loop's selector. The "prompt" rows built an
``openai.AsyncOpenAI`` and never closed it (``prompt``'s ``aclose()`` leaves the client
to its owner; ``wrap``'s closes it). When the garbage collector later freed such a client
while the loop ran, its transports' ``__del__`` closed their sockets, and the client's
own ``__del__`` scheduled an ``aclose()`` whose ``transport.abort()`` then unregistered,
by fd number, the sockets the next row had opened on those reused numbers. Closing every
client a row makes leaves nothing for the collector to close late.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import bench_trust
import pytest

from coalesce.testing import SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

#: Nothing is sent: building a row's caller and closing it makes no request.
UNUSED_URL = "http://127.0.0.1:9"


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every SDK client the benchmark makes, in order."""
    clients: list[Any] = []

    def recording(factory: Callable[..., Any]) -> Callable[..., Any]:
        def make(*args: Any, **kwargs: Any) -> Any:
            client = factory(*args, **kwargs)
            clients.append(client)
            return client

        return make

    monkeypatch.setattr(bench_trust, "openai_sdk", recording(bench_trust.openai_sdk))
    monkeypatch.setattr(bench_trust, "anthropic_sdk", recording(bench_trust.anthropic_sdk))
    return clients


@pytest.mark.parametrize("way", bench_trust.FAULT_WAYS, ids=lambda way: way.name)
async def test_closing_a_row_closes_its_client(way: bench_trust.Way, made: list[Any]) -> None:
    caller = way.build(UNUSED_URL)
    assert len(made) == 1
    assert not made[0].is_closed()
    await caller.close()
    assert made[0].is_closed(), f"{way.name}: its SDK client is left to the garbage collector"


async def test_a_prompt_caller_that_answered_closes_its_client() -> None:
    sim = SimulatedProvider()
    client = sim.openai_client()
    caller = bench_trust.via_prompt(client, {"max_wait": 0.0})
    mail = "Mail #1: about the prize, sent 3 May."
    assert await caller.ask(mail) == expected_output(mail, bench_trust.SCHEMA)
    await caller.close()
    assert client.is_closed()

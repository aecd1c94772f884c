"""No tokenizer is loaded on the event loop while calls wait: loading one takes 0.2-0.3 s
of CPU, which a cold burst's held calls would spend from their budgets (the drop-in
client charged each reply's usage with an encoding loaded at the first reply)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import coalesce
from coalesce._planning import encodings
from coalesce._planning.tokens import estimator_for
from coalesce.testing import SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::coalesce.CoalesceWarning"),
]

INSTRUCTIONS = "You are a support assistant. Answer in one short sentence. " * 20


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The encodings loaded from now on (none is loaded yet)."""
    encodings.forget_encodings()
    estimator_for.cache_clear()  # its estimators hold their encodings
    loaded: list[str] = []
    resolve = encodings._resolve

    def recording(name: str) -> Any:
        loaded.append(name)
        return resolve(name)

    monkeypatch.setattr(encodings, "_resolve", recording)
    yield loaded
    encodings.forget_encodings()
    estimator_for.cache_clear()


async def test_no_encoding_is_loaded_once_calls_are_in_flight(loads: list[str]) -> None:
    sim = SimulatedProvider(time_scale=0.5)
    client = coalesce.wrap(sim.openai_client(), latency_budget=2.0)

    async def one(n: int) -> None:
        await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": f"question {n}"},
            ],
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        await anyio.wait_all_tasks_blocked()  # the first call is in flight
        in_flight = list(loads)
        for n in range(1, 5):
            tg.start_soon(one, n)
    assert loads == in_flight, "an encoding was loaded while calls were in flight"
    await client.aclose()

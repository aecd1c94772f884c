"""A policy may hold items out of every window (``Hold``) and send one alone to learn
from it (``PROBE``): held items come back when their hold is due or when a batch ends,
together, in the order they arrived. Virtual time, both backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from coalesce import Batcher, DispatchReason, Due
from coalesce._batching.policy import Hold

pytestmark = pytest.mark.anyio


class Holding:
    """While ``holding``, the first item goes alone as a probe and the others are held
    for ``hold`` seconds; after, items join and a window of them is due at once."""

    def __init__(self, hold: float = 1.0) -> None:
        self.hold = hold
        self.holding = True
        self.probed = False
        self.offers: list[tuple[Any, float]] = []

    def before_add(self, members: Sequence[Any], item: Any, now: float) -> Any:
        self.offers.append((item, now))
        if not self.holding:
            return None
        if not self.probed:
            self.probed = True
            return DispatchReason.PROBE
        return Hold(now + self.hold)

    def after_add(self, members: Sequence[Any], now: float) -> Due | None:
        return None if self.holding else Due(now, DispatchReason.DEADLINE)


class Learning:
    """A batch function whose first batch takes ``probe`` seconds and, when it ends,
    tells the policy to stop holding."""

    def __init__(self, policy: Holding, probe: float) -> None:
        self.policy, self.probe = policy, probe
        self.batches: list[tuple[float, list[Any]]] = []

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append((anyio.current_time(), list(items)))
        if len(self.batches) == 1:
            await anyio.sleep(self.probe)
            self.policy.holding = False
        return [("result", item) for item in items]


async def burst(batcher: Batcher[Any, Any], items: list[Any]) -> list[Any]:
    """Submit ``items`` at once, in order; their results in order."""
    waiting = [batcher.submit_nowait(item) for item in items]
    results: list[Any] = [None] * len(items)

    async def one(index: int) -> None:
        results[index] = await waiting[index]

    async with anyio.create_task_group() as tg:
        for index in range(len(items)):
            tg.start_soon(one, index)
    return results


async def test_held_items_come_back_together_when_the_probe_ends() -> None:
    policy = Holding(hold=1.0)
    fn = Learning(policy, probe=0.3)
    batcher = Batcher(fn, max_wait=0.05, max_items=10, policy=policy)
    start = anyio.current_time()
    results = await burst(batcher, list(range(5)))
    assert results == [("result", n) for n in range(5)]
    assert [(t - start, items) for t, items in fn.batches] == [
        (0.0, [0]),
        (pytest.approx(0.3), [1, 2, 3, 4]),  # released at the probe's end, as one group
    ]
    reasons = batcher.statistics().dispatch_reasons
    assert (reasons["probe"], reasons["deadline"], reasons["solo"]) == (1, 1, 0)
    # Each held item was offered twice: on arrival and when released.
    assert [item for item, _ in policy.offers] == [0, 1, 2, 3, 4, 1, 2, 3, 4]
    # Their wait counts from their arrival, not from their release.
    assert batcher.statistics().wait_p99 == pytest.approx(0.3)


async def test_held_items_come_back_when_their_hold_is_due() -> None:
    policy = Holding(hold=0.2)
    fn = Learning(policy, probe=1.0)
    batcher = Batcher(fn, max_wait=0.05, max_items=10, policy=policy)
    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(burst, batcher, [0, 1, 2])
        await anyio.sleep(0.2 + 1e-6)
        # Offered again at 0.2 and held again (the policy still holds): not dispatched.
        assert [round(t - start, 6) for _, t in policy.offers] == [0, 0, 0, 0.2, 0.2]
        assert len(fn.batches) == 1
    assert [items for _, items in fn.batches] == [[0], [1, 2]]
    assert fn.batches[1][0] - start == pytest.approx(1.0)


async def test_a_cancelled_held_caller_is_withdrawn() -> None:
    policy = Holding(hold=1.0)
    fn = Learning(policy, probe=0.5)
    batcher = Batcher(fn, max_wait=0.05, max_items=10, policy=policy)
    probe = batcher.submit_nowait("probe")
    async with anyio.create_task_group() as tg:
        with anyio.move_on_after(0.1):
            await batcher("impatient")
        assert batcher.statistics().queue_depth == 0
        tg.start_soon(batcher, "patient")
        await probe
    assert [items for _, items in fn.batches] == [["probe"], ["patient"]]
    assert batcher.statistics().items_cancelled == 1


async def test_closing_releases_what_is_held() -> None:
    policy = Holding(hold=10.0)
    fn = Learning(policy, probe=0.0)
    policy.probed = True  # no probe: everything is held
    batcher = Batcher(fn, max_wait=0.05, max_items=10, policy=policy)
    async with anyio.create_task_group() as tg:
        tg.start_soon(burst, batcher, ["a", "b"])
        await anyio.sleep(0.1)
        assert batcher.statistics().queue_depth == 2
        assert "next flush in" in repr(batcher)
        await batcher.aclose()
    assert [items for _, items in fn.batches] == [["a", "b"]]
    assert batcher.statistics().dispatch_reasons["close"] == 1


async def test_a_hold_that_is_already_over_is_ignored() -> None:
    policy = Holding(hold=0.0)
    policy.probed = True
    fn = Learning(policy, probe=0.0)
    batcher = Batcher(fn, max_wait=0.05, max_items=10, policy=policy)
    assert await burst(batcher, ["a", "b"]) == [("result", "a"), ("result", "b")]
    assert [items for _, items in fn.batches] == [["a", "b"]]
    assert batcher.statistics().dispatch_reasons["window"] == 1

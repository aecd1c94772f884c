"""Property: whatever the arrivals, limits, failures and cancellations, every call
resolves exactly once, with its own result or its own error, and no batch breaks a
limit. Runs on asyncio and trio, on virtual time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import looptime
import pytest
from hypothesis import given
from hypothesis import strategies as st
from trio.testing import MockClock

from coalesce import Batcher


@dataclass(frozen=True)
class Call:
    ident: int
    delay: float  # after the previous arrival
    key: int
    weight: int
    fails_alone: bool  # the batch function returns an exception for this item
    breaks_batch: bool  # the batch function raises for any batch containing it
    cancel_after: float | None


class Boom(Exception):
    def __init__(self, idents: frozenset[int]) -> None:
        super().__init__(sorted(idents))
        self.idents = idents


calls_strategy = st.lists(
    st.builds(
        Call,
        ident=st.just(0),
        delay=st.sampled_from([0.0, 0.0, 0.001, 0.004, 0.01, 0.03]),
        key=st.integers(0, 2),
        weight=st.integers(0, 12),
        fails_alone=st.booleans(),
        breaks_batch=st.integers(0, 9).map(lambda n: n == 0),
        cancel_after=st.one_of(st.none(), st.sampled_from([0.0, 0.002, 0.02, 0.05])),
    ),
    min_size=1,
    max_size=30,
).map(lambda calls: [Call(i, *list(vars(c).values())[1:]) for i, c in enumerate(calls)])

limits_strategy = st.fixed_dictionaries(
    {
        "max_items": st.integers(1, 6),
        "max_wait": st.sampled_from([0.0, 0.005, 0.02]),
        "max_concurrency": st.one_of(st.none(), st.integers(1, 3)),
        "max_pending": st.one_of(st.none(), st.integers(1, 8)),
    },
    optional={"max_size": st.integers(5, 20)},
)


def run_on(backend: str, fn: Any) -> Any:
    if backend == "trio":
        return anyio.run(
            fn, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)}
        )
    return anyio.run(
        fn, backend="asyncio", backend_options={"loop_factory": looptime.new_event_loop}
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@given(calls=calls_strategy, limits=limits_strategy, duration=st.sampled_from([0.0, 0.01]))
def test_every_call_resolves_exactly_once_with_its_own_outcome(
    backend: str, calls: list[Call], limits: dict[str, Any], duration: float
) -> None:
    by_ident = {call.ident: call for call in calls}
    batches: list[tuple[float, list[int]]] = []
    outcomes: dict[int, list[tuple[str, Any]]] = {call.ident: [] for call in calls}
    cancelled_at: dict[int, float] = {}

    async def batch_fn(idents: list[int]) -> list[Any]:
        batches.append((anyio.current_time(), list(idents)))
        if duration:
            await anyio.sleep(duration)
        if any(by_ident[i].breaks_batch for i in idents):
            raise Boom(frozenset(idents))
        return [ValueError(i) if by_ident[i].fails_alone else ("ok", i) for i in idents]

    options = dict(limits)
    if "max_size" in options:
        options["size"] = lambda ident: by_ident[ident].weight

    async def main() -> None:
        batcher = Batcher(batch_fn, partition=lambda ident: by_ident[ident].key, **options)

        async def caller(call: Call) -> None:
            try:
                if call.cancel_after is None:
                    outcomes[call.ident].append(("value", await batcher(call.ident)))
                    return
                with anyio.move_on_after(call.cancel_after) as scope:
                    outcomes[call.ident].append(("value", await batcher(call.ident)))
                if scope.cancelled_caught:
                    cancelled_at[call.ident] = anyio.current_time()
                    outcomes[call.ident].append(("cancelled", None))
            except Exception as exc:
                outcomes[call.ident].append(("error", exc))

        async with anyio.create_task_group() as tg:
            for call in calls:
                if call.delay:
                    await anyio.sleep(call.delay)
                tg.start_soon(caller, call)
        await batcher.aclose()
        stats = batcher.statistics()
        assert stats.queue_depth == 0
        assert stats.batches_in_flight == 0
        # A caller cancelled while waiting for room (max_pending) never submitted.
        assert stats.items_submitted <= len(calls)
        assert stats.items_completed + stats.items_failed <= stats.items_submitted

    run_on(backend, main)

    seen: dict[int, int] = {}
    for dispatched_at, idents in batches:
        assert len(idents) <= limits["max_items"]
        assert len({by_ident[i].key for i in idents}) == 1, "partitions never share a batch"
        if "max_size" in limits and len(idents) > 1:
            assert sum(by_ident[i].weight for i in idents) <= limits["max_size"]
        for ident in idents:
            seen[ident] = seen.get(ident, 0) + 1
            # A caller cancelled strictly before this dispatch was taken out of it.
            if ident in cancelled_at:
                assert cancelled_at[ident] >= dispatched_at
    assert all(count == 1 for count in seen.values()), "an item reached two batches"

    for call in calls:
        results = outcomes[call.ident]
        assert len(results) == 1, f"call {call.ident} resolved {len(results)} times"
        kind, value = results[0]
        if kind == "cancelled":
            continue
        assert call.ident in seen, "a call resolved without ever being dispatched"
        batch = next(idents for _, idents in batches if call.ident in idents)
        if any(by_ident[i].breaks_batch for i in batch):
            assert kind == "error"
            assert isinstance(value, Boom)
            assert call.ident in value.idents
        elif call.fails_alone:
            assert kind == "error"
            assert isinstance(value, ValueError)
            assert value.args == (call.ident,)
        else:
            assert (kind, value) == ("value", ("ok", call.ident))

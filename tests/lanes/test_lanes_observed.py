"""What the batch lane tells (issue 25, items 2 and 3): a job adopted from a stopped
process is counted apart from this run's figures, and each window, upload,
submission and poll is logged as it happens. On the simulated provider, on virtual
time."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import coalesce
from coalesce._engine.spec import Options
from coalesce._lanes import openai_jobs
from coalesce._lanes.records import ItemRow
from coalesce._lanes.results import POLL_INTERVAL, Poll
from coalesce._lanes.router import _poll_interval
from coalesce._pricing import cost, price_for
from coalesce.testing import BatchTiming, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

TIMING = BatchTiming(validating=10, per_request=1, finalizing=5, cancelling=2)


def summariser(sim: SimulatedProvider, store: Path, **options: Any) -> Any:
    async def summarise(text: str) -> str:
        """Summarise the text."""

    options = {"max_items": 3, "packing": "always", "lane": "batch", **options}
    return coalesce.prompt(client=sim.openai_client(), model="gpt-4o-mini", store=store, **options)(
        summarise
    )


async def ask_all(fn: Any, texts: list[str]) -> dict[str, str]:
    answers: dict[str, str] = {}

    async def one(text: str) -> None:
        answers[text] = await fn(text)

    async with anyio.create_task_group() as tg:
        for text in texts:
            tg.start_soon(one, text)
    return answers


async def stopped_after_submitting(sim: SimulatedProvider, store: Path, texts: list[str]) -> str:
    """What a process killed while it polled left: its job planned and submitted in the
    store, its batch running at the provider. Its batch id."""
    gone = summariser(sim, store)
    lane = gone._lanes.batch_lane()
    spec = lane.spec
    rows = [
        ItemRow.for_call(spec.name, spec.model, spec.instructions, spec.output_schema, text)
        for text in texts
    ]
    lane.store.add_items(rows)
    (job,) = lane._plan(rows)
    return await openai_jobs.submit(lane.store, lane.client, job)


def line_cost(sim: SimulatedProvider, batch_id: str) -> float:
    """What the provider billed for a batch's lines (half the list price)."""
    price = price_for("gpt-4o-mini")
    assert price is not None
    records = [r for r in sim.requests if r.batch_id == batch_id]
    assert records
    return sum(
        cost(r.prompt_tokens, r.completion_tokens, price, cached_input_tokens=r.cached_tokens) / 2
        for r in records
    )


async def test_an_adopted_job_is_counted_apart_from_this_runs_figures(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    store = tmp_path / "jobs.sqlite3"
    left = [f"left {i}" for i in range(6)]
    adopted_batch = await stopped_after_submitting(sim, store, left)
    fn = summariser(sim, store)
    own = [f"own {i}" for i in range(3)]
    answers = await ask_all(fn, left + own)
    await fn.aclose()
    assert answers == {text: expected_output(text) for text in left + own}
    old, new = sim.batch_submissions
    assert old.batch_id == adopted_batch
    stats = fn.statistics()
    assert (stats.adopted_jobs, stats.adopted_requests) == (1, 2)  # 6 items, 3 to a line
    assert stats.adopted_cost == pytest.approx(line_cost(sim, old.batch_id))
    assert stats.requests == 1  # this run's own line
    assert stats.estimated_cost == pytest.approx(line_cost(sim, new.batch_id))
    assert dict(stats.cost_by_lane) == {"batch": stats.estimated_cost}
    assert stats.calls == 9  # every caller of this run, answered from either job


class Timed(logging.Handler):
    """Keeps each record's message with the (virtual) time it was logged at."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[float, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((anyio.current_time(), record.levelno, record.getMessage()))

    def first(self, text: str) -> tuple[float, int, str]:
        return next(line for line in self.lines if text in line[2])


@pytest.fixture
def timed() -> Iterator[Timed]:
    handler = Timed()
    logger = logging.getLogger("coalesce")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_each_step_of_the_batch_lane_is_logged_as_it_happens(
    tmp_path: Path, timed: Timed
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    fn = summariser(sim, tmp_path / "jobs.sqlite3", batch_window=60.0)
    start = anyio.current_time()
    texts = [f"text {i}" for i in range(6)]
    await ask_all(fn, texts)
    await fn.aclose()
    ((batch,),) = [[s.batch_id for s in sim.batch_submissions]]
    window = timed.first("a window of 6 calls, 6 items to ask")
    planned = timed.first("planned")
    uploaded = timed.first("uploaded 2 lines")
    created = timed.first(f"created batch {batch} (validating)")
    polls = [line for line in timed.lines if "next poll in" in line[2]]
    ended = timed.first(f"batch {batch}: completed, 2/2 lines done")
    collected = next(line for line in timed.lines if "6 results, 0 failed, $" in line[2])
    assert window[0] == start + 60.0  # when the window closed, not at the end
    assert [line[1] for line in (window, planned, uploaded, created, ended)] == [logging.INFO] * 5
    assert window[0] <= planned[0] <= uploaded[0] <= created[0] <= polls[0][0] < ended[0]
    assert all(line[1] == logging.DEBUG for line in polls)
    assert [line[0] for line in polls] == sorted(line[0] for line in polls)
    assert "validating" in polls[0][2]
    assert collected[0] == ended[0]
    # Each line's request event names its line, not "request ? (no group)".
    requests = [line[2] for line in timed.lines if ": request " in line[2]]
    assert len(requests) == 2
    assert not any("request ?" in line or "no group" in line for line in requests)
    assert all("(attempt 1)" in line for line in requests)


async def test_poll_interval_is_the_longest_wait_between_two_polls(
    tmp_path: Path, timed: Timed
) -> None:
    slow = BatchTiming(validating=10, per_request=600, finalizing=5, cancelling=2)
    sim = SimulatedProvider(batches=slow)
    fn = summariser(sim, tmp_path / "jobs.sqlite3", batch_window=0.0)
    fn._lanes.batch_lane().poll = Poll.every(20.0)
    await ask_all(fn, ["a", "b", "c"])
    await fn.aclose()
    polls = [line[0] for line in timed.lines if "next poll in" in line[2]]
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls)]
    assert max(gaps) == 20.0
    assert gaps[0] == 5.0


def test_poll_interval_comes_from_the_functions_options_with_a_default() -> None:
    assert _poll_interval(Options(poll_interval=20)) == 20.0
    assert _poll_interval(Options()) == POLL_INTERVAL == 60.0
    with pytest.raises(coalesce.ConfigurationError, match="poll_interval"):
        Options(poll_interval=0)


async def test_a_function_finishes_only_its_own_jobs_from_a_shared_store(
    tmp_path: Path,
) -> None:
    """Two functions keep their jobs in one store: a job the other one left is not
    finished (nor its replies validated) by this one; the other finishes it."""
    sim = SimulatedProvider(batches=TIMING)
    store = tmp_path / "jobs.sqlite3"
    left = [f"left {i}" for i in range(3)]
    theirs = await stopped_after_submitting(sim, store, left)

    async def classify(text: str) -> str:
        """Classify the text."""

    other = coalesce.prompt(
        client=sim.openai_client(), model="gpt-4o-mini", store=store,
        max_items=3, packing="always", lane="batch",
    )(classify)  # fmt: skip
    assert await ask_all(other, ["mine"]) == {"mine": expected_output("mine")}
    await other.aclose()
    assert other.statistics().adopted_jobs == 0
    assert sim.batch_submissions[0].batch_id == theirs  # submitted once, by the process gone
    owner = summariser(sim, store)
    assert await ask_all(owner, left) == {text: expected_output(text) for text in left}
    await owner.aclose()
    assert owner.statistics().adopted_jobs == 1
    assert owner.statistics().requests == 0  # all three answered from the adopted job

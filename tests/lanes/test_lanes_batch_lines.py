"""The batch lane's lines and money (issue 14, points 2 and 4): packed only where packing
pays, a line of one item asked as a plain call, statistics and each job's cost at the
batch price, and a create refused for the enqueued-token limit retried. On the
simulated provider, on virtual time."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import coalesce
from coalesce._lanes.lane import line_sizes
from coalesce._lanes.lines import BatchLimits
from coalesce._lanes.results import plain_reading
from coalesce._lanes.store import JobStore
from coalesce.testing import BatchTiming, FlexProcessing, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

TIMING = BatchTiming(validating=10, per_request=1, finalizing=5, cancelling=2)
RULES = " ".join(f"Rule {n}: keep the summary short and factual." for n in range(40))


def summariser(client: Any, store: Path, *, long: bool = True, **options: Any) -> Any:
    async def summarise(text: str) -> str:
        """Summarise the text."""

    instructions = f"Summarise the text. {RULES}" if long else None
    return coalesce.prompt(
        client=client, model="gpt-4o-mini", store=store, instructions=instructions, **options
    )(summarise)


async def ask_all(fn: Any, texts: list[str]) -> dict[str, str]:
    answers: dict[str, str] = {}

    async def one(text: str) -> None:
        answers[text] = await fn(text)

    async with anyio.create_task_group() as tg:
        for text in texts:
            tg.start_soon(one, text)
    return answers


def client_for(sim: SimulatedProvider, api: str) -> Any:
    return sim.openai_client() if api == "openai" else sim.anthropic_client()


# ----------------------------------------------------------------- line sizes (pure)


def test_lines_are_even_and_as_few_as_the_cap_allows() -> None:
    assert line_sizes(23, 10, 2) == [8, 8, 7]
    assert line_sizes(20, 5, 2) == [5, 5, 5, 5]
    assert line_sizes(3, 10, 2) == [3]
    assert line_sizes(0, 10, 2) == []


def test_lines_too_small_to_pay_are_plain_requests() -> None:
    assert line_sizes(3, 10, 4) == [1, 1, 1]  # 3 < the smallest paying group
    assert line_sizes(30, 10, None) == [1] * 30  # packing never pays
    assert line_sizes(5, 1, 2) == [1] * 5  # max_items=1


@given(
    items=st.integers(min_value=0, max_value=500),
    per_line=st.integers(min_value=1, max_value=50),
    pays_from=st.one_of(st.none(), st.integers(min_value=2, max_value=60)),
)
def test_every_item_is_in_one_line_within_the_cap_and_packed_only_where_it_pays(
    items: int, per_line: int, pays_from: int | None
) -> None:
    sizes = line_sizes(items, per_line, pays_from)
    assert sum(sizes) == items
    assert all(1 <= size <= per_line for size in sizes)
    packed = [size for size in sizes if size > 1]
    assert pays_from is not None or packed == []
    assert all(pays_from is not None and size >= pays_from for size in packed)
    if packed:  # as few lines as the cap allows
        assert len(sizes) == -(-items // per_line)


# ------------------------------------------------------------ lines on the provider


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_function_packing_cannot_pay_for_sends_plain_lines(
    tmp_path: Path, api: str
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    with pytest.warns(coalesce.CoalesceWarning, match="packing"):
        fn = summariser(client_for(sim, api), tmp_path / "jobs.db", long=False, lane="batch")
    texts = [f"text {i}" for i in range(6)]
    answers = await ask_all(fn, texts)
    await fn.aclose()
    assert answers == {text: expected_output(text) for text in texts}
    (submission,) = sim.batch_submissions
    assert submission.items == len(submission.custom_ids) == 6
    assert {plain_reading(custom_id) for custom_id in submission.custom_ids} == {"text"}


async def test_a_line_of_one_item_is_the_request_a_plain_call_sends(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    plain = summariser(sim.openai_client(), tmp_path / "a.db", lane="realtime")
    await plain("the same text")
    await plain.aclose()
    batched = summariser(sim.openai_client(), tmp_path / "b.db", lane="batch")
    await batched("the same text")
    await batched.aclose()
    realtime, line = sim.requests
    assert (realtime.batch_id, realtime.items) == (None, 1)
    assert line.batch_id is not None
    assert line.prompt_tokens == realtime.prompt_tokens  # the same request, token for token
    assert line.completion_tokens == realtime.completion_tokens


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_statistics_and_the_jobs_cost_are_at_the_batch_price(
    tmp_path: Path, api: str
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    store = tmp_path / "jobs.db"
    fn = summariser(client_for(sim, api), store, lane="batch", max_items=10)
    texts = [f"text {i}" for i in range(23)]
    assert await ask_all(fn, texts) == {text: expected_output(text) for text in texts}
    await fn.aclose()
    stats = fn.statistics()
    assert dict(stats.calls_by_lane) == {"batch": 23}
    assert stats.requests == 3  # lines of 8, 8 and 7
    assert stats.items_per_request == pytest.approx(23 / 3)
    price = coalesce.price_for("gpt-4o-mini")
    assert price is not None
    list_price = (
        sum(
            price.input_per_mtok * r.prompt_tokens + price.output_per_mtok * r.completion_tokens
            for r in sim.requests
        )
        / 1e6
    )
    assert stats.cost_by_lane["batch"] == pytest.approx(list_price / 2)
    assert stats.estimated_cost < 0.5 * stats.estimated_cost_one_per_item  # both savings
    with JobStore(store) as jobs:
        (job,) = jobs.list_jobs()
        assert job.cost_usd == pytest.approx(stats.cost_by_lane["batch"])


async def test_a_stored_result_the_function_finds_invalid_is_asked_again(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    store = tmp_path / "jobs.db"
    first = summariser(sim.openai_client(), store, lane="batch")
    await first("text")
    await first.aclose()
    with sqlite3.connect(store) as db:  # as if collected without the output type
        db.execute("UPDATE items SET result = '42' WHERE state = 'done'")
    again = summariser(sim.openai_client(), store, lane="batch")
    assert await again("text") == expected_output("text")
    await again.aclose()
    assert len(sim.batch_submissions) == 2


#: Slow lines: a batch of many lines stays enqueued for a long (virtual) while.
SLOW = BatchTiming(validating=10, per_request=10, finalizing=5, cancelling=2)


async def batch_tokens(api: str, store: Path, texts: list[str], **options: Any) -> int:
    """The prompt tokens the enqueued-token limit counts for these calls' job."""
    probe = SimulatedProvider(batches=TIMING)
    fn = summariser(client_for(probe, api), store, lane="batch", **options)
    await ask_all(fn, texts)
    await fn.aclose()
    return sum(record.prompt_tokens for record in probe.requests)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_create_over_the_enqueued_token_limit_waits_for_the_queue(
    tmp_path: Path, api: str
) -> None:
    early = [f"early {i}" for i in range(50)]  # 50 plain lines: enqueued for ~500 s
    late = ["late 0", "late 1"]
    tokens = await batch_tokens(api, tmp_path / "p1.db", early, max_items=1)
    tokens += await batch_tokens(api, tmp_path / "p2.db", late)
    sim = SimulatedProvider(batches=SLOW, enqueued_token_limit=tokens - 1)  # not both
    first = summariser(client_for(sim, api), tmp_path / "a.db", lane="batch", max_items=1)
    second = summariser(client_for(sim, api), tmp_path / "b.db", lane="batch")
    answers: dict[str, str] = {}

    async def run(fn: Any, texts: list[str]) -> None:
        answers.update(await ask_all(fn, texts))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, first, early)
        while not sim.batch_submissions:  # noqa: ASYNC110 (the simulator has no event)
            await anyio.sleep(0.5)
        tg.start_soon(run, second, late)  # created while the early job holds the queue
    await first.aclose()
    await second.aclose()
    assert answers == {t: expected_output(t) for t in early + late}
    accepted = [s for s in sim.batch_submissions if not s.failed]
    assert [s.items for s in accepted] == [50, 2]
    assert accepted[1].created_at >= accepted[0].created_at + 500  # after the queue drained
    assert second.statistics().calls_failed == 0


async def test_batch_client_sends_the_deferred_lanes_with_its_own_key(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING, flex=FlexProcessing(unavailable=0))
    fn = summariser(
        sim.openai_client(api_key="sk-people"),
        tmp_path / "jobs.db",
        batch_client=sim.openai_client(api_key="sk-nightly"),
    )
    await ask_all(fn, ["now"])
    with coalesce.latency_budget(30 * 60):
        await ask_all(fn, ["minutes"])
    with coalesce.latency_budget(48 * 3600):
        await ask_all(fn, ["tonight"])
    await fn.aclose()
    keys = {(r.batch_id is not None, r.service_tier): r.api_key for r in sim.requests}
    assert keys == {
        (False, "default"): "sk-people",
        (False, "flex"): "sk-nightly",
        (True, None): "sk-nightly",
    }


def test_batch_client_must_be_the_same_providers(tmp_path: Path) -> None:
    sim = SimulatedProvider()
    with pytest.raises(coalesce.ConfigurationError, match=r"batch_client= must be .* \(openai\)"):
        summariser(sim.openai_client(), tmp_path / "j.db", batch_client=sim.anthropic_client())


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_items_a_reply_missed_are_asked_again_in_a_follow_up_job(
    tmp_path: Path, api: str
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.inject(["missing_item"])  # the first line's reply leaves one item out
    fn = summariser(client_for(sim, api), tmp_path / "jobs.db", lane="batch", max_items=4)
    texts = [f"text {i}" for i in range(8)]
    assert await ask_all(fn, texts) == {text: expected_output(text) for text in texts}
    await fn.aclose()
    first, follow_up = sim.batch_submissions
    assert first.items == 8
    assert follow_up.items == 1  # only the missed item, alone: a plain line
    assert plain_reading(follow_up.custom_ids[0]) is not None


async def test_a_reply_that_keeps_missing_an_item_ends_in_its_callers_error(
    tmp_path: Path,
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.inject(["missing_item"], ["truncate"])
    fn = summariser(sim.openai_client(), tmp_path / "jobs.db", lane="batch", max_attempts=2)
    answers: dict[str, Any] = {}

    async def one(text: str) -> None:
        try:
            answers[text] = await fn(text)
        except coalesce.ItemError as exc:
            answers[text] = exc

    async with anyio.create_task_group() as tg:
        for text in ["a", "b"]:
            tg.start_soon(one, text)
    await fn.aclose()
    errors = [value for value in answers.values() if isinstance(value, coalesce.ItemError)]
    assert len(errors) == 1  # the other caller got its own answer
    assert "after 2 jobs" in str(errors[0])
    assert len(sim.batch_submissions) == 2


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_window_over_the_providers_limits_goes_as_several_jobs(
    tmp_path: Path, api: str
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    fn = summariser(client_for(sim, api), tmp_path / "jobs.db", lane="batch", max_items=2)
    fn._lanes.batch_lane().limits = BatchLimits(max_lines=3, max_bytes=10**9)
    texts = [f"text {i}" for i in range(14)]  # 7 lines of 2: jobs of 3, 3 and 1 lines
    assert await ask_all(fn, texts) == {text: expected_output(text) for text in texts}
    await fn.aclose()
    assert sorted(len(s.custom_ids) for s in sim.batch_submissions) == [1, 3, 3]
    ids = [custom_id for s in sim.batch_submissions for custom_id in s.custom_ids]
    assert len(set(ids)) == len(ids)

"""``coalesce jobs wait | cancel | resume`` on virtual time (issue 25, item 3): the
cost of what they collect, a batch still validating, what ``cancel`` counts as done,
and the follow-up job ``resume`` plans for what an expired batch left unanswered.

The commands run through :func:`~coalesce._lanes.jobs_cli.run_command`, with the
provider's client built on the simulated provider in process (``jobs_cli.connect`` is
replaced), so that the batches' hours pass in virtual time. Nothing here asserts a
duration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import anyio
import openai
import pytest

from _batch_jobs import MODELS, POLL, TIMING, plan, texts
from coalesce._lanes import anthropic_jobs, jobs_cli, openai_jobs
from coalesce._lanes.jobs_cli import build_parser, run_command
from coalesce._lanes.jobs_live import API, Connection
from coalesce._lanes.records import BatchJob, Provider
from coalesce._lanes.store import JobStore
from coalesce._pricing import cost, price_for
from coalesce.providers import AnthropicProvider, OpenAIProvider
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio

Run = Callable[..., Any]
SUBMIT = {"openai": openai_jobs.submit, "anthropic": anthropic_jobs.submit}
KINDS = pytest.mark.parametrize("kind", ["openai", "anthropic"])


def client_of(sim: SimulatedProvider, kind: str) -> Any:
    if kind == "openai":
        return sim.openai_client(max_retries=0)
    return sim.anthropic_client(max_retries=0)


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(batches=TIMING)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.sqlite3"


@pytest.fixture
def run(
    sim: SimulatedProvider, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Run:
    """``coalesce jobs ARGV...`` in the running loop, its clients on the simulated
    provider in process: (exit code, stdout, stderr)."""

    @asynccontextmanager
    async def connect(provider: Provider, base_url: str | None) -> AsyncIterator[Connection]:
        errors = openai.APIError if provider == "openai" else anthropic.APIError
        async with client_of(sim, provider) as client:
            yield Connection(API[provider], client, errors)

    monkeypatch.setattr(jobs_cli, "connect", connect)

    async def run(*argv: str | Path, poll: float = 30) -> tuple[int, str, str]:
        args = build_parser().parse_args([*map(str, argv), "--poll", str(poll)])
        code = await run_command(args)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def planned(path: Path, sim: SimulatedProvider, kind: str, n: int = 9) -> BatchJob:
    """A job of ``n`` items, 3 to a line, planned in the store and not submitted."""
    provider: OpenAIProvider | AnthropicProvider = (
        OpenAIProvider(sim.openai_client())
        if kind == "openai"
        else AnthropicProvider(sim.anthropic_client())
    )
    with JobStore(path) as store:
        return plan(store, provider, texts(n, kind), per_line=3)


async def submitted(path: Path, sim: SimulatedProvider, kind: str) -> BatchJob:
    """A job planned and submitted by a process that then stopped."""
    job = planned(path, sim, kind)
    async with client_of(sim, kind) as client:
        with JobStore(path) as store:
            await SUBMIT[kind](store, client, job, POLL)
            again = store.get_job(job.id)
    assert again is not None
    return again


async def one_line_done(sim: SimulatedProvider, kind: str, batch_id: str) -> None:
    """Wait (on the condition; virtual time) until the batch has answered a line."""
    async with client_of(sim, kind) as client:
        while True:
            if kind == "openai":
                counts = (await client.batches.retrieve(batch_id)).request_counts
                done = counts.completed if counts else 0
            else:
                done = (await client.messages.batches.retrieve(batch_id)).request_counts.succeeded
            if done:
                return
            await anyio.sleep(0.5)


def billed(sim: SimulatedProvider, kind: str) -> float:
    """What the provider's ledger says its batch lines cost: list price, halved."""
    price = price_for(MODELS[kind])
    assert price is not None
    return sum(
        cost(
            record.prompt_tokens,
            record.completion_tokens,
            price,
            cached_input_tokens=record.cached_tokens,
            cache_write_tokens=record.cache_write_tokens,
        )
        / 2
        for record in sim.requests
        if record.batch_id is not None and record.status == 200
    )


def recorded(path: Path, job: BatchJob) -> BatchJob:
    with JobStore(path) as store:
        found = store.get_job(job.id)
    assert found is not None
    return found


# --- 1. what a collected job cost ------------------------------------------------------


@KINDS
@pytest.mark.parametrize("command", ["wait", "resume"])
async def test_a_job_collected_by_the_command_records_its_cost(
    path: Path, sim: SimulatedProvider, run: Run, kind: str, command: str
) -> None:
    job = await submitted(path, sim, kind)
    argv = [command, job.id] if command == "wait" else [command]
    code, out, _ = await run(*argv, "--store", path)
    assert code == 0
    spent = recorded(path, job).cost_usd
    assert spent > 0
    assert spent == pytest.approx(billed(sim, kind))
    if command == "wait":
        assert f"cost        ${spent:.4f} so far" in out.splitlines()
    else:
        assert f"${spent:.4f}" in out


@KINDS
async def test_cancel_records_the_cost_of_the_lines_it_collected(
    path: Path, sim: SimulatedProvider, run: Run, kind: str
) -> None:
    sim.expire_next_batch(after_lines=1)
    job = await submitted(path, sim, kind)
    assert job.provider_batch_id is not None
    await one_line_done(sim, kind, job.provider_batch_id)
    code, _, _ = await run("cancel", job.id, "--store", path)
    assert code == 0
    spent = recorded(path, job).cost_usd
    assert spent > 0
    assert spent == pytest.approx(billed(sim, kind))


async def test_a_model_without_a_price_says_its_cost_is_not_recorded(
    path: Path, sim: SimulatedProvider, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await submitted(path, sim, "openai")
    monkeypatch.setattr("coalesce._lanes.jobs_live.price_for", lambda model: None)
    code, out, _ = await run("wait", job.id, "--store", path)
    assert code == 0
    assert out.splitlines()[0] == (
        f"job {job.id} completed: 9 results, 0 failed; no price is known for gpt-4o-mini,"
        f" so its cost is not recorded"
    )
    assert recorded(path, job).cost_usd == 0


# --- 2. a batch being validated ---------------------------------------------------------


async def test_a_batch_still_validating_is_listed_and_waited_for(
    path: Path, sim: SimulatedProvider, run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    job = planned(path, sim, "openai")
    async with client_of(sim, "openai") as client, anyio.create_task_group() as tg:
        with JobStore(path) as store:
            tg.start_soon(openai_jobs.submit, store, client, job, POLL)  # the batch lane
            while (batch_id := recorded(path, job).provider_batch_id) is None:  # noqa: ASYNC110 (the store has no event)
                await anyio.sleep(0.01)
            assert (await client.batches.retrieve(batch_id)).status == "validating"
            assert jobs_cli.main(["list", "--store", str(path)]) == 0
            row = capsys.readouterr().out.splitlines()[1].split()
            assert row[4:6] == ["submitted", batch_id]
            code, out, err = await run("wait", job.id, "--store", path)
    assert code == 0
    assert out.splitlines()[0] == f"job {job.id} completed: 9 results, 0 failed"
    assert err.splitlines()[0].startswith(f"job {job.id[:12]}: validating, 0/3 lines done")
    assert [s.batch_id for s in sim.batch_submissions] == [batch_id]


async def test_a_batch_refused_at_validation_is_created_again_and_the_job_kept(
    path: Path, tmp_path: Path
) -> None:
    # Two jobs of one model, more tokens than the enqueued-token limit allows at
    # once: the second batch is refused at validation, the job goes back to
    # "uploaded" (no batch), and its batch is created again once the queue drains.
    probe = SimulatedProvider(batches=TIMING)
    async with client_of(probe, "openai") as client:
        with JobStore(tmp_path / "probe.sqlite3") as store:
            plan(store, OpenAIProvider(client), texts(9, "early"), per_line=3)
            await openai_jobs.resume(store, client, lambda value: value, POLL)
    tokens = sum(record.prompt_tokens for record in probe.requests)
    sim = SimulatedProvider(batches=TIMING, enqueued_token_limit=tokens)
    states: list[tuple[str, str | None]] = []
    async with client_of(sim, "openai") as client:
        with JobStore(path) as store:
            early = plan(store, OpenAIProvider(client), texts(9, "early"), per_line=3)
            late = plan(store, OpenAIProvider(client), texts(9, "late"), per_line=3)
            await openai_jobs.submit(store, client, early, POLL)
            original = store.mark_refused

            def watched(job_id: str, batch_id: str) -> bool:
                taken = original(job_id, batch_id)
                again = store.get_job(job_id)
                assert again is not None
                states.append((again.state, again.provider_batch_id))
                return taken

            store.mark_refused = watched  # type: ignore[method-assign,assignment]
            batch_id = await openai_jobs.submit(store, client, late, POLL)
            final = store.get_job(late.id)
    assert states == [("uploaded", None)]
    _, refused, accepted = sim.batch_submissions
    assert refused.failed
    assert not accepted.failed
    assert final is not None
    assert (final.state, final.provider_batch_id) == ("submitted", accepted.batch_id)
    assert batch_id == accepted.batch_id
    assert refused.input_file_id == accepted.input_file_id  # the file is not uploaded twice


# --- 4. what cancel counts as done -------------------------------------------------------


@KINDS
async def test_cancel_counts_the_lines_that_were_answered(
    path: Path, sim: SimulatedProvider, run: Run, kind: str
) -> None:
    sim.expire_next_batch(after_lines=1)
    job = await submitted(path, sim, kind)
    assert job.provider_batch_id is not None
    await one_line_done(sim, kind, job.provider_batch_id)
    code, out, err = await run("cancel", job.id, "--store", path)
    assert code == 0
    final = "cancelled" if kind == "openai" else "ended"
    assert err.splitlines()[-1].startswith(
        f"job {job.id[:12]}: {final}, 1/3 lines done, 2 unanswered, "
    )
    assert out.splitlines()[0].startswith(f"job {job.id} cancelled: 3 results, 0 failed, 6 ")


# --- 8. resume plans the follow-up of an expired batch ----------------------------------


HOUR = 3600.0


@KINDS
async def test_resume_asks_again_in_a_follow_up_job_what_an_expired_batch_left(
    path: Path, sim: SimulatedProvider, run: Run, kind: str
) -> None:
    sim.expire_next_batch(after_lines=1)  # one line of three answers, then it expires
    job = planned(path, sim, kind)
    code, out, _ = await run("resume", "--store", path, poll=HOUR)
    assert code == 0
    first, again = sim.batch_submissions
    with JobStore(path) as store:
        follow_up = store.job_for_batch(again.batch_id)
        assert follow_up is not None
        assert dict(follow_up.metadata)["coalesce_follow_up_of"] == job.id
        assert store.pending_items() == []
        done = (
            store.job_summary(job.id).items["done"] + store.job_summary(follow_up.id).items["done"]
        )
    lines = out.splitlines()
    assert lines[:3] == [
        f"job {job.id} expired: 3 results, 0 failed, 6 unanswered and pending again",
        f"follow-up job {follow_up.id} completed: 6 results, 0 failed",
        "",
    ]
    assert [row.split()[0] for row in lines[3:]] == ["ID", job.id[:12], follow_up.id[:12]]
    assert done == 9
    # The same two requests, sent again under new custom_ids.
    assert len(again.custom_ids) == 2
    assert set(again.custom_ids).isdisjoint(first.custom_ids)
    assert again.items == 6


async def test_resume_leaves_a_cancelled_jobs_items_and_says_so(
    path: Path, sim: SimulatedProvider, run: Run
) -> None:
    sim.expire_next_batch(after_lines=1)
    job = await submitted(path, sim, "openai")
    assert job.provider_batch_id is not None
    await one_line_done(sim, "openai", job.provider_batch_id)
    assert (await run("cancel", job.id, "--store", path))[0] == 0
    code, out, _ = await run("resume", "--store", path)
    assert code == 0
    assert out.splitlines() == [
        f"no unfinished jobs in the job store {path}",
        "6 items are still pending that resume does not ask again (their line was answered"
        " in part, their job was cancelled, or they were asked --max-attempts times): the"
        " program asks them when it runs again with the same calls",
    ]
    assert len(sim.batch_submissions) == 1


async def test_resume_asks_no_item_more_than_max_attempts_times(
    path: Path, sim: SimulatedProvider, run: Run
) -> None:
    sim.expire_next_batch(after_lines=1)
    sim.expire_next_batch(after_lines=1)
    job = planned(path, sim, "openai")
    code, out, _ = await run("resume", "--store", path, "--max-attempts", "2", poll=HOUR)
    assert code == 0
    assert out.splitlines()[1].startswith("follow-up job ")
    assert out.splitlines()[1].endswith(
        " expired: 3 results, 0 failed, 3 unanswered and"
        " pending again (`coalesce jobs resume` asks them again in a follow-up job)"
    )
    code, out, _ = await run("resume", "--store", path, "--max-attempts", "2", poll=HOUR)
    assert out.splitlines()[1].startswith("3 items are still pending")
    assert len(sim.batch_submissions) == 2
    with JobStore(path) as store:
        assert {item.attempts for item in store.pending_items()} == {2}
    assert job.id

"""Durable Anthropic message batches (issue 14, points 3-4), against the simulated
Message Batches API through the official SDK, on virtual time. A "crash" is a store
closed after some step and opened again, as a restarted process would."""

from __future__ import annotations

from pathlib import Path

import pytest

from _batch_jobs import POLL, TIMING, VALIDATE, plan, texts
from coalesce._lanes.anthropic_jobs import resume, submit
from coalesce._lanes.lines import as_json
from coalesce._lanes.results import Poll
from coalesce._lanes.store import JobStore
from coalesce.providers import AnthropicProvider
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


async def test_a_packed_job_answers_every_item(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.anthropic_client(max_retries=0) as client:
        with JobStore(tmp_path / "jobs.sqlite3") as store:
            job = plan(store, AnthropicProvider(client), texts(12), per_line=4)
            outcome = (await resume(store, client, VALIDATE, POLL))[job.id]
            recorded = store.get_job(job.id)
    assert outcome.state == "completed"
    assert len(outcome.results) == 12
    assert set(outcome.results.values()) <= {"positive", "negative"}
    assert recorded is not None
    assert recorded.state == "completed"
    (submission,) = sim.batch_submissions
    assert len(submission.custom_ids) == 3


async def test_a_crash_between_create_and_record_finds_the_batch_by_its_requests(
    tmp_path: Path,
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    path = tmp_path / "jobs.sqlite3"
    async with sim.anthropic_client(max_retries=0) as client:
        store = JobStore(path)
        provider = AnthropicProvider(client)
        # Someone else's batch of the same size, created first: not ours.
        other = JobStore(tmp_path / "other.sqlite3")
        stranger = plan(other, provider, texts(6, "other"), per_line=3)
        await submit(other, client, stranger)
        job = plan(store, provider, texts(6), per_line=3)
        requests = [as_json(line.request) for line in store.job_lines(job.id)]
        created = await client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
        store.close()  # died before recording the batch id
        store = JobStore(path)
        outcome = (await resume(store, client, VALIDATE, POLL))[job.id]
        recorded = store.get_job(job.id)
        store.close()
        other.close()
    assert recorded is not None
    assert recorded.provider_batch_id == created.id
    assert len(sim.batch_submissions) == 2  # the stranger's and ours, once
    assert len(outcome.results) == 6


async def test_a_crash_while_polling_attaches_to_the_job(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    path = tmp_path / "jobs.sqlite3"
    async with sim.anthropic_client(max_retries=0) as client:
        store = JobStore(path)
        job = plan(store, AnthropicProvider(client), texts(8), per_line=4)
        batch_id = await submit(store, client, job)
        store.close()
        store = JobStore(path)
        outcome = (await resume(store, client, VALIDATE, POLL))[job.id]
        store.close()
    assert [s.batch_id for s in sim.batch_submissions] == [batch_id]
    assert len(outcome.results) == 8


async def test_an_expired_job_keeps_its_results_and_releases_the_rest(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.expire_next_batch(after_lines=1)
    async with sim.anthropic_client(max_retries=0) as client:
        with JobStore(tmp_path / "jobs.sqlite3") as store:
            provider = AnthropicProvider(client)
            job = plan(store, provider, texts(9), per_line=3)
            first = (await resume(store, client, VALIDATE, Poll(first=3600, longest=3600)))[job.id]
            pending = [item.input for item in store.pending_items()]
            follow_up = plan(store, provider, pending, per_line=3)
            second = (await resume(store, client, VALIDATE, POLL))[follow_up.id]
    assert first.state == "expired"
    assert (len(first.results), len(first.released)) == (3, 6)
    assert second.state == "completed"
    assert len(first.results) + len(second.results) == 9

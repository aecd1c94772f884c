"""Durable OpenAI batch jobs (issue 14, points 3-4), against the simulated Batch API
through the official SDK, on virtual time.

A "crash" here is a process that stopped after some step: its store is closed and a
new one opened on the same file, as a restarted process would, and :func:`resume`
must finish the job without submitting anything twice (counted on the provider side).
The same with a real ``kill -9`` of a process is for the benchmark-style script.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _batch_jobs import POLL, TIMING, VALIDATE, plan, texts
from coalesce._lanes.lines import jsonl
from coalesce._lanes.openai_jobs import collect, resume, submit, wait
from coalesce._lanes.results import Poll
from coalesce._lanes.store import JobStore
from coalesce.providers import OpenAIProvider
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


def restarted(path: Path, old: JobStore) -> JobStore:
    old.close()
    return JobStore(path)


async def test_a_packed_job_answers_every_item_with_one_line_per_group(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.openai_client(max_retries=0) as client:
        with JobStore(tmp_path / "jobs.sqlite3") as store:
            job = plan(store, OpenAIProvider(client), texts(12), per_line=4)
            outcome = (await resume(store, client, VALIDATE, POLL))[job.id]
            summary = store.job_summary(job.id)
            done = store.get_job(job.id)
    assert outcome.state == "completed"
    assert len(outcome.results) == 12
    assert set(outcome.results.values()) <= {"positive", "negative"}
    assert not outcome.failures
    assert done is not None
    assert done.state == "completed"
    assert summary.items.get("done") == 12
    (submission,) = sim.batch_submissions
    assert len(submission.custom_ids) == 3  # 12 items, 4 per line


async def test_a_crash_after_upload_creates_the_batch_once_from_the_same_file(
    tmp_path: Path,
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    path = tmp_path / "jobs.sqlite3"
    async with sim.openai_client(max_retries=0) as client:
        store = JobStore(path)
        job = plan(store, OpenAIProvider(client), texts(6), per_line=3)
        data = jsonl(line.request for line in store.job_lines(job.id))
        upload = await client.files.create(file=("in.jsonl", data), purpose="batch")
        store.mark_uploaded(job.id, upload.id)
        store = restarted(path, store)  # the process died before creating the batch
        outcome = (await resume(store, client, VALIDATE, POLL))[job.id]
        store.close()
    (submission,) = sim.batch_submissions
    assert submission.input_file_id == upload.id
    assert len(outcome.results) == 6


async def test_a_crash_between_create_and_record_finds_the_batch_by_its_metadata(
    tmp_path: Path,
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    path = tmp_path / "jobs.sqlite3"
    async with sim.openai_client(max_retries=0) as client:
        store = JobStore(path)
        job = plan(store, OpenAIProvider(client), texts(6), per_line=3)
        data = jsonl(line.request for line in store.job_lines(job.id))
        upload = await client.files.create(file=("in.jsonl", data), purpose="batch")
        store.mark_uploaded(job.id, upload.id)
        await client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata=dict(job.metadata),
        )
        store = restarted(path, store)  # died before recording the batch id
        outcome = (await resume(store, client, VALIDATE, POLL))[job.id]
        store.close()
    assert len(sim.batch_submissions) == 1
    assert len(outcome.results) == 6


async def test_a_crash_while_polling_attaches_to_the_job(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    path = tmp_path / "jobs.sqlite3"
    async with sim.openai_client(max_retries=0) as client:
        store = JobStore(path)
        job = plan(store, OpenAIProvider(client), texts(8), per_line=4)
        batch_id = await submit(store, client, job)
        store = restarted(path, store)  # died while polling
        outcome = (await resume(store, client, VALIDATE, POLL))[job.id]
        assert store.unfinished_jobs() == []
        store.close()
    assert [s.batch_id for s in sim.batch_submissions] == [batch_id]
    assert len(outcome.results) == 8


async def test_an_expired_job_keeps_its_results_and_a_follow_up_answers_the_rest(
    tmp_path: Path,
) -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.expire_next_batch(after_lines=1)
    async with sim.openai_client(max_retries=0) as client:
        with JobStore(tmp_path / "jobs.sqlite3") as store:
            provider = OpenAIProvider(client)
            job = plan(store, provider, texts(9), per_line=3)
            first = (await resume(store, client, VALIDATE, Poll(first=3600, longest=3600)))[job.id]
            assert first.state == "expired"
            assert len(first.results) == 3
            assert len(first.released) == 6
            pending = [item.input for item in store.pending_items()]
            follow_up = plan(store, provider, pending, per_line=3)
            second = (await resume(store, client, VALIDATE, POLL))[follow_up.id]
    assert second.state == "completed"
    assert first.results.keys().isdisjoint(second.results)
    assert len(first.results) + len(second.results) == 9
    assert len(sim.batch_submissions) == 2


async def test_a_completed_batch_whose_lines_all_failed_is_a_failed_job(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.inject("server_error", "server_error")
    async with sim.openai_client(max_retries=0) as client:
        with JobStore(tmp_path / "jobs.sqlite3") as store:
            job = plan(store, OpenAIProvider(client), texts(4), per_line=2)
            batch = await wait(client, await submit(store, client, job), POLL)
            assert batch.status == "completed"
            outcome = await collect(store, client, job, batch, VALIDATE)
            recorded = store.get_job(job.id)
            pending = store.pending_items()
    assert outcome.state == "failed"
    assert recorded is not None
    assert recorded.state == "failed"
    assert len(outcome.released) == 4  # a 5xx may succeed when asked again
    assert len(pending) == 4

"""``kill -9`` of a batch-lane client, then the same client started again: every
result, and no batch submitted twice, counted by the simulated provider (issue 14).

The provider is ``coalesce simulate`` in its own process (its batches outlive the
client's), at a time scale that makes a day's batch window a minute and a half. The
client is tests/_jobs_child.py. Nothing here asserts a duration.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from coalesce._demo import simulated_provider

CHILD = Path(__file__).parent.parent / "_jobs_child.py"
N, PER_LINE = 40, 8


def start(store: Path, url: str, kind: str, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(CHILD), str(store), url, str(N), str(PER_LINE), kind, *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def job_state(store: Path) -> str | None:
    if not store.exists():
        return None
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            row = db.execute("SELECT state FROM jobs").fetchone()
    except sqlite3.OperationalError:  # the child has not created the tables yet
        return None
    return None if row is None else str(row[0])


def wait_for(predicate: object, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds  # a guard against a hang, not a measurement
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def finish(store: Path, url: str, kind: str) -> dict[str, int]:
    with start(store, url, kind) as again:
        out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    return dict(json.loads(out.strip().splitlines()[-1]))


def submissions(url: str) -> list[dict[str, object]]:
    batches: list[dict[str, object]] = httpx.get(f"{url}/_sim/stats").json()["batches"]
    return batches


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_kill_while_polling_then_restart(tmp_path: Path, kind: str) -> None:
    store = tmp_path / "jobs.sqlite3"
    # Lines of 0.4 s each (at the time scale): the batch runs for about 2 s, so the job
    # is seen submitted and killed while it polls, not after its results came back.
    with simulated_provider(time_scale=0.001, batches={"per_request": 400.0}) as url:
        with start(store, url, kind) as first:
            wait_for(lambda: job_state(store) == "submitted", "the job to be submitted")
            os.kill(first.pid, signal.SIGKILL)
        assert first.returncode == -signal.SIGKILL
        assert job_state(store) == "submitted"
        summary = finish(store, url, kind)
        assert summary == {"results": N, "failures": 0}
        assert len(submissions(url)) == 1


@pytest.mark.slow
def test_kill_between_upload_and_create_then_restart(tmp_path: Path) -> None:
    store = tmp_path / "jobs.sqlite3"
    with simulated_provider(time_scale=0.001) as url:
        with start(store, url, "openai", "stop-after-upload") as first:
            assert first.stdout is not None
            assert first.stdout.readline().strip() == "stop-after-upload"
            os.kill(first.pid, signal.SIGKILL)
        assert first.returncode == -signal.SIGKILL
        assert job_state(store) == "uploaded"
        assert submissions(url) == []
        summary = finish(store, url, "openai")
        assert summary == {"results": N, "failures": 0}
        assert len(submissions(url)) == 1


@pytest.mark.slow
def test_kill_between_create_and_record_then_restart_anthropic(tmp_path: Path) -> None:
    # Anthropic's batches carry no metadata: the restarted client finds its batch by
    # the custom_ids of its requests, and does not create another.
    store = tmp_path / "jobs.sqlite3"
    with simulated_provider(time_scale=0.001) as url:
        with start(store, url, "anthropic", "stop-after-create") as first:
            assert first.stdout is not None
            assert first.stdout.readline().strip() == "stop-after-create"
            os.kill(first.pid, signal.SIGKILL)
        assert first.returncode == -signal.SIGKILL
        assert job_state(store) == "planned"
        assert len(submissions(url)) == 1
        summary = finish(store, url, "anthropic")
        assert summary == {"results": N, "failures": 0}
        assert len(submissions(url)) == 1

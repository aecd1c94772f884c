"""The runnable examples run, and say what they should."""

from __future__ import annotations

import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from coalesce._demo import simulated_provider

EXAMPLES = Path(__file__).parent.parent / "examples"


def run(name: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def test_batch_basics() -> None:
    out = run("batch_basics.py")
    assert "40 calls -> 3 batch calls" in out
    assert "unknown: 'kiwi'" in out


NIGHTLY = EXAMPLES / "nightly_tagging.py"
TICKETS, PER_LINE = 300, 10
SUMMARY = {
    "tagged": r"tickets: ([\d,]+) tagged",
    "own": r"\(([\d,]+) answers are the simulator's own",
    "jobs": r"batch jobs submitted this run: ([\d,]+)",
    "lines": r"batch lines \(requests\): ([\d,]+)",
    "new": r"answered by this run's new jobs: ([\d,]+)",
    "earlier": r"from earlier runs[^:]*: ([\d,]+)",
}


def nightly(store: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(NIGHTLY), "--tickets", str(TICKETS), "--store", str(store)]
    return subprocess.Popen([*command, *extra], stdout=subprocess.PIPE, text=True)


def nightly_summary(store: Path, *extra: str) -> dict[str, int]:
    """Run the example to its end; the numbers of its summary."""
    with nightly(store, *extra) as child:
        out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out
    assert "failed:" not in out, out
    found = {name: re.search(pattern, out) for name, pattern in SUMMARY.items()}
    assert all(found.values()), out
    return {name: int(match.group(1).replace(",", "")) for name, match in found.items() if match}


def provider_batches(url: str) -> list[dict[str, Any]]:
    batches: list[dict[str, Any]] = httpx.get(f"{url}/_sim/stats").json()["batches"]
    return batches


def job_states(store: Path) -> list[str]:
    """The states of the jobs in the store (read only; none before it exists)."""
    if not store.exists():
        return []
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            return [str(state) for (state,) in db.execute("SELECT state FROM jobs")]
    except sqlite3.OperationalError:  # the tables are not there yet
        return []


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # a guard against a hang, not a measurement
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


@pytest.mark.slow
def test_nightly_tagging_packs_the_tickets_and_answers_a_second_run_from_the_store(
    tmp_path: Path,
) -> None:
    store = tmp_path / "jobs.sqlite3"
    first = nightly_summary(store)
    assert first["tagged"] == first["own"] == first["new"] == TICKETS
    assert first["jobs"] == 1
    assert first["lines"] <= math.ceil(TICKETS / PER_LINE)
    # Same store: every ticket answered, nothing submitted (the provider's count).
    second = nightly_summary(store)
    assert second["tagged"] == second["own"] == second["earlier"] == TICKETS
    assert (second["jobs"], second["lines"], second["new"]) == (0, 0, 0)


@pytest.mark.slow
def test_nightly_tagging_killed_while_waiting_attaches_to_its_job(tmp_path: Path) -> None:
    # The provider runs on in its own process, as a real one would; its batches take a
    # moment (time scale 0.2). The first run is killed once the provider has its batch,
    # while it polls (its first poll is 10 s away): the job's id may not be in the store
    # yet (it is recorded once the batch is past validation), and then the next run finds
    # the batch by its metadata.
    store = tmp_path / "jobs.sqlite3"
    with simulated_provider(time_scale=0.2) as url:
        with nightly(store, "--simulator", url) as first:
            wait_for(lambda: len(provider_batches(url)) == 1, "the batch to be created")
            os.kill(first.pid, signal.SIGKILL)
        assert first.returncode == -signal.SIGKILL
        assert job_states(store) in (["uploaded"], ["submitted"])
        (batch,) = provider_batches(url)
        assert batch["items"] == TICKETS
        assert len(set(batch["custom_ids"])) == len(batch["custom_ids"]) <= TICKETS / PER_LINE
        status = f"{url}/v1/batches/{batch['batch_id']}"
        wait_for(lambda: httpx.get(status).json()["status"] == "completed", "the batch to end")
        again = nightly_summary(store, "--simulator", url)
        assert again["tagged"] == again["own"] == again["earlier"] == TICKETS
        assert (again["jobs"], again["new"]) == (0, 0)
        assert len(provider_batches(url)) == 1


@pytest.mark.slow
def test_copilot_endpoint_answers_every_call() -> None:
    out = run("copilot_endpoint.py")
    # Every call is answered: a suggestion, or "out of time" at its deadline (timing
    # itself is not asserted on a shared machine; the budget tests run on virtual time).
    assert out.startswith("12 calls answered: ")
    assert "provider requests; p95" in out

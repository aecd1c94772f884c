"""The runnable examples run, and say what they should."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_nightly_tagging_groups_background_work() -> None:
    out = run("nightly_tagging.py")
    assert out.startswith("400 tickets in ")
    requests = int(out.split(" in ")[1].split()[0])
    assert requests < 100


@pytest.mark.slow
def test_copilot_endpoint_answers_every_call() -> None:
    out = run("copilot_endpoint.py")
    # Every call is answered: a suggestion, or "out of time" at its deadline (timing
    # itself is not asserted on a shared machine; the budget tests run on virtual time).
    assert out.startswith("12 calls answered: ")
    assert "provider requests; p95" in out

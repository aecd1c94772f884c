"""What tests/gateway/test_gateway_lanes.py shares: ``coalesce serve`` as a process of
its own, its job store read from outside, and calls sent to it from threads (each may
break off when the gateway is killed)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


def start_gateway(
    sim_url: str, log: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``coalesce serve`` in front of the simulator at ``sim_url``; its process and URL."""
    command = [
        sys.executable, "-m", "coalesce", "serve", "--port", "0", "--max-items", "4",
        "--openai-upstream", f"{sim_url}/v1", "--anthropic-upstream", sim_url, *flags,
    ]  # fmt: skip
    with log.open("ab") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith(b"coalesce gateway listening on "):
        process.kill()
        raise AssertionError(log.read_text())
    return process, line.split()[-1].decode()


def job_states(store: Path) -> list[str]:
    """The states of the store's jobs (none before it has its tables)."""
    if not store.exists():
        return []
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            return [str(row[0]) for row in db.execute("SELECT state FROM jobs")]
    except sqlite3.OperationalError:  # the tables are not there yet
        return []


def wait_for(predicate: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    """Wait until ``predicate()``: a guard against a hang, not a measurement."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def post_all(url: str, bodies: list[dict[str, Any]], headers: dict[str, str]) -> list[Any]:
    """POST every body to ``url``'s chat completions at once, each from a thread; the
    replies (or the exception each got), in order. Returns once all have ended."""
    out: list[Any] = [None] * len(bodies)

    def one(index: int) -> None:
        try:
            out[index] = httpx.post(
                f"{url}/v1/chat/completions", json=bodies[index], headers=headers, timeout=120
            )
        except httpx.HTTPError as exc:
            out[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def in_background(task: Callable[[], object]) -> threading.Thread:
    """Run ``task`` in a daemon thread, started."""
    thread = threading.Thread(target=task, daemon=True)
    thread.start()
    return thread

"""A plain script: threads call ``tag.sync``; the interpreter then exits cleanly (the
background loop is stopped at exit). Run in a subprocess of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _threads import CALLS, MOST_REQUESTS

SCRIPT = '''
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from pydantic import BaseModel, TypeAdapter

import coalesce
from coalesce.testing import SimulatedProvider

sim = SimulatedProvider(time_scale=0.02)


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]


@coalesce.prompt(
    client=sim.openai_client(max_retries=0), model="gpt-4o-mini",
    max_items=10, max_wait=5.0, packing="always",
)
async def tag(ticket: str) -> Tag:
    """Tag the support ticket with its category."""


tickets = [f"ticket {n}" for n in range(CALLS)]
start = threading.Barrier(CALLS)


def one(ticket):
    start.wait()
    return tag.sync(ticket)


with ThreadPoolExecutor(CALLS) as pool:
    answers = list(pool.map(one, tickets))
adapter = TypeAdapter(Tag)
expected = [adapter.validate_python(sim.expected_output(t, adapter.json_schema())) for t in tickets]
print(json.dumps({
    "right": answers == expected,
    "requests": sim.statistics().requests,
    "threads": sorted(t.name for t in threading.enumerate()),
}))
'''


def test_a_script_with_threads(tmp_path: Path) -> None:
    script = tmp_path / "tag_tickets.py"
    script.write_text(SCRIPT.replace("CALLS", str(CALLS)), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    report = json.loads(done.stdout)
    assert report["right"]
    assert report["requests"] == CALLS // 10 <= MOST_REQUESTS
    assert "coalesce-background-loop" in report["threads"]  # and yet the script ended

"""A batch-lane client run as its own process by tests/lanes/test_lanes_kill.py.

``python tests/_jobs_child.py STORE URL N PER_LINE PROVIDER [STOP]`` plans N items into
a job for PROVIDER (``openai`` or ``anthropic``) unless the store already holds
unfinished jobs, submits it and waits for its results, printing ``{"results": ...,
"failures": ...}``. With STOP ``stop-after-upload`` (OpenAI) it uploads the file,
records it and waits to be killed; with ``stop-after-create`` it creates the batch
without recording its id and waits to be killed: so a test can kill it exactly there.
Not a test module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anthropic
import anyio
import openai

from _batch_jobs import VALIDATE, plan, texts
from coalesce._lanes import anthropic_jobs, openai_jobs
from coalesce._lanes.lines import as_json, jsonl
from coalesce._lanes.results import Poll
from coalesce._lanes.store import JobStore
from coalesce.providers import AnthropicProvider, OpenAIProvider


async def main(path: str, url: str, n: int, per_line: int, kind: str, stop: str) -> None:
    if kind == "openai":
        client: Any = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", max_retries=0)
        provider: Any = OpenAIProvider(client)
    else:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-sim", max_retries=0)
        provider = AnthropicProvider(client)
    with JobStore(Path(path)) as store:
        if not store.unfinished_jobs():
            job_id = plan(store, provider, texts(n), per_line).id
            if stop:
                await crash_point(store, client, job_id, stop)
        poll = Poll(first=0.05, factor=1.5, longest=0.5)
        runner = openai_jobs if kind == "openai" else anthropic_jobs
        outcomes = await runner.resume(store, client, VALIDATE, poll)
    results = sum(len(o.results) for o in outcomes.values())
    failures = sum(len(o.failures) for o in outcomes.values())
    print(json.dumps({"results": results, "failures": failures}), flush=True)


async def crash_point(store: JobStore, client: Any, job_id: str, stop: str) -> None:
    """Do the steps up to ``stop`` by hand, say so, and wait to be killed."""
    lines = store.job_lines(job_id)
    if stop == "stop-after-upload":
        data = jsonl(line.request for line in lines)
        upload = await client.files.create(file=("in.jsonl", data), purpose="batch")
        store.mark_uploaded(job_id, upload.id)
    else:  # stop-after-create (Anthropic): created, its id never recorded
        await client.messages.batches.create(requests=[as_json(line.request) for line in lines])
    print(stop, flush=True)
    await anyio.sleep_forever()


if __name__ == "__main__":
    args = sys.argv[1:]
    stop = args[5] if len(args) > 5 else ""
    anyio.run(main, args[0], args[1], int(args[2]), int(args[3]), args[4], stop)

"""A batch-lane client run as its own process by tests/test_lanes_kill.py.

``python tests/_jobs_child.py STORE URL N PER_LINE [stop-after-upload]`` plans N items
into a job (unless the store already holds unfinished jobs), submits it and waits for
its results, printing ``{"results": ..., "failures": ...}``. With ``stop-after-upload``
it uploads the file, records it and then waits to be killed, so a test can kill it
exactly between upload and create. Not a test module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import anyio
import openai
from pydantic import TypeAdapter

from coalesce._lanes.lines import jsonl, openai_line
from coalesce._lanes.openai_jobs import resume
from coalesce._lanes.records import ItemRow, PlannedLine
from coalesce._lanes.results import Poll
from coalesce._lanes.store import JobStore
from coalesce._wire.packing import pack_request
from coalesce.providers import CompletionRequest, OpenAIProvider

Label = Literal["positive", "negative"]
SCHEMA = TypeAdapter(Label).json_schema()
INSTRUCTIONS = "Label the review's sentiment."
MODEL = "gpt-4o-mini"


def plan(store: JobStore, provider: OpenAIProvider, n: int, per_line: int) -> str:
    rows = [ItemRow.for_call("label", MODEL, INSTRUCTIONS, SCHEMA, f"review {i}") for i in range(n)]
    store.add_items(rows)
    planned = []
    for start in range(0, n, per_line):
        group = rows[start : start + per_line]
        packed = pack_request(INSTRUCTIONS, [row.input for row in group], SCHEMA)
        request = CompletionRequest(
            model=MODEL, system=packed.system, user=packed.user, reply_schema=packed.reply_schema
        )
        custom_id = store.new_custom_id()
        body = openai_line(custom_id, provider.arguments(request))
        planned.append(PlannedLine(custom_id, body, [row.key for row in group]))
    return store.plan_job("openai", MODEL, "batch", planned).id


async def main(path: str, url: str, n: int, per_line: int, stop: bool) -> None:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", max_retries=0)
    with JobStore(Path(path)) as store:
        if not store.unfinished_jobs():
            job_id = plan(store, OpenAIProvider(client), n, per_line)
            if stop:
                lines = store.job_lines(job_id)
                data = jsonl(line.request for line in lines)
                upload = await client.files.create(file=("in.jsonl", data), purpose="batch")
                store.mark_uploaded(job_id, upload.id)
                print("uploaded", flush=True)
                await anyio.sleep_forever()
        poll = Poll(first=0.05, factor=1.5, longest=0.5)
        outcomes = await resume(store, client, TypeAdapter(Label).validate_python, poll)
    results = sum(len(o.results) for o in outcomes.values())
    failures = sum(len(o.failures) for o in outcomes.values())
    print(json.dumps({"results": results, "failures": failures}), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    anyio.run(main, args[0], args[1], int(args[2]), int(args[3]), "stop-after-upload" in args)

"""Shared by the batch-job tests and tests/_jobs_child.py: a labelling task, and a job
planned in the store with its items packed ``per_line`` to a line. Not a test module."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import TypeAdapter

from coalesce._lanes.lines import anthropic_request, openai_line
from coalesce._lanes.records import BatchJob, ItemRow, PlannedLine
from coalesce._lanes.results import Poll
from coalesce._lanes.store import JobStore
from coalesce._wire.packing import pack_request
from coalesce.providers import CompletionRequest
from coalesce.testing import BatchTiming

Label = Literal["positive", "negative"]
SCHEMA = TypeAdapter(Label).json_schema()
VALIDATE = TypeAdapter(Label).validate_python
INSTRUCTIONS = "Label the review's sentiment."
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-20250514"}
TIMING = BatchTiming(validating=10, per_request=1, finalizing=5, cancelling=2)
POLL = Poll(first=5, factor=2, longest=60)


def plan(store: JobStore, provider: Any, texts: list[str], per_line: int) -> BatchJob:
    """A job asking ``provider``'s batch API for ``texts``' labels, ``per_line`` a line."""
    kind = provider.batch_api
    model = MODELS[kind]
    rows = [ItemRow.for_call("label", model, INSTRUCTIONS, SCHEMA, text) for text in texts]
    store.add_items(rows)
    build = openai_line if kind == "openai" else anthropic_request
    planned = []
    for start in range(0, len(rows), per_line):
        group = rows[start : start + per_line]
        packed = pack_request(INSTRUCTIONS, [row.input for row in group], SCHEMA)
        request = CompletionRequest(
            model=model, system=packed.system, user=packed.user, reply_schema=packed.reply_schema
        )
        custom_id = store.new_custom_id()
        body = build(custom_id, provider.arguments(request))
        planned.append(PlannedLine(custom_id, body, [row.key for row in group]))
    return store.plan_job(kind, model, "batch", planned)


def texts(n: int, tag: str = "review") -> list[str]:
    return [f"{tag} {i}: {'loved it' if i % 2 else 'awful'}" for i in range(n)]

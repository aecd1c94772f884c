"""Packed batch lines (issue 14, point 2): built from the providers' own request
arguments, chunked to the limits, read back from the simulated batch APIs through the
official SDKs, and split per item."""

from __future__ import annotations

import json
from typing import Any, Literal

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from coalesce import ConfigurationError
from coalesce._lanes.lines import (
    BatchLimits,
    LineOutcome,
    anthropic_request,
    chunk,
    encoded_size,
    openai_line,
    read_anthropic_result,
    read_openai_line,
)
from coalesce._wire.packing import pack_request, split_reply
from coalesce.providers import AnthropicProvider, CompletionRequest, OpenAIProvider
from coalesce.testing import BatchTiming, SimulatedProvider

TIMING = BatchTiming(validating=10, per_request=1, finalizing=5, cancelling=2)
Label = Literal["positive", "negative"]
SCHEMA = TypeAdapter(Label).json_schema()
INSTRUCTIONS = "Label the review's sentiment."


def packed(items: list[str]) -> tuple[CompletionRequest, tuple[str, ...]]:
    request = pack_request(INSTRUCTIONS, items, SCHEMA)
    completion = CompletionRequest(
        model="gpt-4o-mini",
        system=request.system,
        user=request.user,
        reply_schema=request.reply_schema,
    )
    return completion, request.ids


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def answers(outcome: LineOutcome, ids: tuple[str, ...]) -> dict[str, Any]:
    assert outcome.status == "ok", outcome.error
    split = split_reply(outcome.text, ids, lambda value: TypeAdapter(Label).validate_python(value))
    assert not split.failures
    return dict(split.values)


@pytest.mark.anyio
async def test_packed_openai_lines_come_back_split_per_item() -> None:
    sim = SimulatedProvider(batches=TIMING)
    groups = [[f"review {g}-{i}" for i in range(4)] for g in range(3)]
    async with sim.openai_client(max_retries=0) as client:
        provider = OpenAIProvider(client)
        requests = [packed(items) for items in groups]
        lines = [
            openai_line(f"line-{n}", provider.arguments(r)) for n, (r, _) in enumerate(requests)
        ]
        upload = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            await anyio.sleep(5)
            batch = await client.batches.retrieve(batch.id)
        assert batch.output_file_id is not None
        output = (await client.files.content(batch.output_file_id)).text.splitlines()
    outcomes = {o.custom_id: o for o in map(read_openai_line, map(json.loads, output))}
    # Three batch lines carried twelve items: each item gets its own answer.
    assert len(sim.batch_submissions[0].custom_ids) == 3
    for n, (_, ids) in enumerate(requests):
        outcome = outcomes[f"line-{n}"]
        assert set(answers(outcome, ids)) == set(ids)
        assert outcome.usage.input_tokens > 0


@pytest.mark.anyio
async def test_an_expired_openai_batch_keeps_finished_lines_and_marks_the_rest_retry() -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.expire_next_batch(after_lines=1)
    async with sim.openai_client(max_retries=0) as client:
        provider = OpenAIProvider(client)
        requests = [packed([f"r{g}a", f"r{g}b"]) for g in range(3)]
        lines = [openai_line(f"l{n}", provider.arguments(r)) for n, (r, _) in enumerate(requests)]
        upload = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            await anyio.sleep(3600)
            batch = await client.batches.retrieve(batch.id)
        assert batch.status == "expired"
        assert batch.output_file_id is not None
        assert batch.error_file_id is not None
        done = (await client.files.content(batch.output_file_id)).text.splitlines()
        undone = (await client.files.content(batch.error_file_id)).text.splitlines()
    outcomes = [read_openai_line(json.loads(line)) for line in [*done, *undone]]
    assert sorted(o.status for o in outcomes) == ["ok", "retry", "retry"]
    assert all("batch_expired" in o.error for o in outcomes if o.status == "retry")


@pytest.mark.anyio
async def test_packed_anthropic_requests_come_back_split_per_item() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.anthropic_client(max_retries=0) as client:
        provider = AnthropicProvider(client)
        requests = [packed([f"review {g}-{i}" for i in range(3)]) for g in range(2)]
        batch_requests: Any = [
            anthropic_request(f"m{n}", provider.arguments(r)) for n, (r, _) in enumerate(requests)
        ]
        batch = await client.messages.batches.create(requests=batch_requests)
        while batch.processing_status != "ended":
            await anyio.sleep(5)
            batch = await client.messages.batches.retrieve(batch.id)
        entries = [
            read_anthropic_result(entry.model_dump())
            async for entry in await client.messages.batches.results(batch.id)
        ]
    outcomes = {o.custom_id: o for o in entries}
    for n, (_, ids) in enumerate(requests):
        assert set(answers(outcomes[f"m{n}"], ids)) == set(ids)


def test_anthropic_requests_never_stream() -> None:
    request = anthropic_request("m0", {"model": "m", "stream": True, "max_tokens": 5})
    assert request == {"custom_id": "m0", "params": {"model": "m", "max_tokens": 5}}


def test_error_lines_say_whether_asking_again_may_help() -> None:
    def openai_error(status: int) -> LineOutcome:
        body = {"error": {"message": "nope"}}
        return read_openai_line(
            {"custom_id": "x", "response": {"status_code": status, "body": body}}
        )

    assert openai_error(429).status == "retry"
    assert openai_error(503).status == "retry"
    assert openai_error(400).status == "failed"
    cancelled = {"custom_id": "x", "response": None, "error": {"code": "batch_cancelled"}}
    assert read_openai_line(cancelled).status == "retry"
    invalid = {"custom_id": "x", "error": {"code": "invalid_request", "message": "bad"}}
    assert read_openai_line(invalid) == LineOutcome("x", "failed", error="invalid_request: bad")
    overloaded = {
        "type": "errored",
        "error": {"type": "error", "error": {"type": "overloaded_error"}},
    }
    assert read_anthropic_result({"custom_id": "y", "result": overloaded}).status == "retry"
    refused = {"type": "errored", "error": {"type": "invalid_request_error", "message": "x"}}
    assert read_anthropic_result({"custom_id": "y", "result": refused}).status == "failed"
    assert (
        read_anthropic_result({"custom_id": "y", "result": {"type": "expired"}}).status == "retry"
    )


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), max_size=60),
    max_lines=st.integers(min_value=1, max_value=10),
    max_bytes=st.integers(min_value=400, max_value=3000),
)
def test_chunks_keep_order_and_stay_within_the_limits(
    sizes: list[int], max_lines: int, max_bytes: int
) -> None:
    lines = [{"custom_id": f"c{n}", "pad": "x" * size} for n, size in enumerate(sizes)]
    jobs = list(chunk(lines, BatchLimits(max_lines, max_bytes)))
    assert [line for job in jobs for line in job] == lines
    for job in jobs:
        assert 1 <= len(job) <= max_lines
        assert sum(map(encoded_size, job)) <= max_bytes


def test_a_line_larger_than_a_job_is_refused_with_the_fix() -> None:
    line = {"custom_id": "big", "pad": "x" * 500}
    with pytest.raises(ConfigurationError, match="lower max_items"):
        list(chunk([line], BatchLimits(max_lines=10, max_bytes=100)))

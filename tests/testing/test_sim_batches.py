"""The simulator's batch APIs (OpenAI files + batches, Anthropic message batches)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
import openai
import pytest

from coalesce.testing import BatchTiming, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

TIMING = BatchTiming(validating=10, per_request=1, finalizing=5, cancelling=2)


def chat_line(custom_id: str, text: str) -> dict[str, Any]:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def test_openai_batch_lifecycle() -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.inject(None, "server_error", "code_fence")
    lines = [chat_line(f"req-{n}", f"question {n}") for n in range(4)]
    async with sim.openai_client(max_retries=0) as client:
        upload = await client.files.create(
            file=("in.jsonl", jsonl(lines), "application/jsonl"), purpose="batch"
        )
        assert upload.purpose == "batch"
        assert upload.bytes == len(jsonl(lines))
        assert (await client.files.retrieve(upload.id)).filename == "in.jsonl"
        batch = await client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"k": "v"},
        )
        seen = [batch.status]
        for _ in range(25):
            await anyio.sleep(1)
            batch = await client.batches.retrieve(batch.id)
            if batch.status != seen[-1]:
                seen.append(batch.status)
        assert seen == ["validating", "in_progress", "finalizing", "completed"]
        assert batch.request_counts is not None
        assert (
            batch.request_counts.total,
            batch.request_counts.completed,
            batch.request_counts.failed,
        ) == (4, 3, 1)
        assert batch.metadata == {"k": "v"}
        assert batch.completed_at is not None
        assert batch.output_file_id
        assert batch.error_file_id
        output = (await client.files.content(batch.output_file_id)).text.splitlines()
        errors = (await client.files.content(batch.error_file_id)).text.splitlines()
    by_id = {json.loads(line)["custom_id"]: json.loads(line)["response"] for line in output}
    assert set(by_id) == {"req-0", "req-2", "req-3"}
    assert by_id["req-0"]["status_code"] == 200
    assert by_id["req-0"]["body"]["choices"][0]["message"]["content"] == expected_output(
        "question 0"
    )
    assert by_id["req-2"]["body"]["choices"][0]["message"]["content"].startswith("```json")
    (error,) = (json.loads(line) for line in errors)
    assert error["custom_id"] == "req-1"
    assert error["response"]["status_code"] == 500
    assert [r.api for r in sim.requests] == ["openai.batch"] * 4
    assert [r.batch_id for r in sim.requests] == [batch.id] * 4


async def test_openai_batch_cancel() -> None:
    sim = SimulatedProvider(batches=TIMING)
    lines = [chat_line(f"r{n}", "q") for n in range(10)]
    async with sim.openai_client(max_retries=0) as client:
        upload = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await anyio.sleep(13.5)  # validated at 10 s; lines finish at 11, 12, 13 s
        batch = await client.batches.cancel(batch.id)
        assert batch.status == "cancelling"
        assert batch.cancelling_at is not None
        await anyio.sleep(2)
        batch = await client.batches.retrieve(batch.id)
        assert batch.status == "cancelled"
        assert batch.cancelled_at is not None
        assert batch.request_counts is not None
        assert batch.request_counts.completed == 3
        assert batch.output_file_id is not None
        content = (await client.files.content(batch.output_file_id)).text
        assert [json.loads(line)["custom_id"] for line in content.splitlines()] == [
            "r0",
            "r1",
            "r2",
        ]
        with pytest.raises(openai.BadRequestError, match="cannot cancel"):
            await client.batches.cancel(batch.id)
        listed = await client.batches.list()
        assert [b.id for b in listed.data] == [batch.id]


async def test_openai_batch_validation() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.openai_client(max_retries=0) as client:
        with pytest.raises(openai.NotFoundError):
            await client.batches.create(
                input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
            )
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            await client.batches.create(
                input_file_id="x", endpoint="/v1/embeddings", completion_window="24h"
            )
        bad = await client.files.create(file=("bad.jsonl", b"not json\n"), purpose="batch")
        batch = await client.batches.create(
            input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await anyio.sleep(11)
        batch = await client.batches.retrieve(batch.id)
        assert batch.status == "failed"
        assert batch.errors is not None
        assert batch.errors.data is not None
        assert batch.errors.data[0].line == 1
        deleted = await client.files.delete(bad.id)
        assert deleted.deleted
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(bad.id)


async def test_anthropic_message_batch_lifecycle() -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.inject(None, "unavailable")
    requests: Any = [
        {
            "custom_id": f"m{n}",
            "params": {
                "model": "claude-x",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": f"q{n}"}],
            },
        }
        for n in range(3)
    ]
    async with sim.anthropic_client(max_retries=0) as client:
        batch = await client.messages.batches.create(requests=requests)
        assert batch.processing_status == "in_progress"
        assert batch.request_counts.processing == 3
        assert batch.results_url is None
        await anyio.sleep(2.5)
        batch = await client.messages.batches.retrieve(batch.id)
        assert (
            batch.request_counts.processing,
            batch.request_counts.succeeded,
            batch.request_counts.errored,
        ) == (1, 1, 1)
        await anyio.sleep(6)
        batch = await client.messages.batches.retrieve(batch.id)
        assert batch.processing_status == "ended"
        assert batch.ended_at is not None
        results = {
            entry.custom_id: entry.result
            async for entry in await client.messages.batches.results(batch.id)
        }
    assert results["m0"].type == "succeeded"
    assert results["m2"].type == "succeeded"
    assert results["m0"].message.content[0].text == expected_output("q0")  # type: ignore[union-attr]
    assert results["m1"].type == "errored"


async def test_anthropic_message_batch_cancel() -> None:
    sim = SimulatedProvider(batches=TIMING)
    requests: Any = [
        {
            "custom_id": f"m{n}",
            "params": {
                "model": "claude-x",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "q"}],
            },
        }
        for n in range(5)
    ]
    async with sim.anthropic_client(max_retries=0) as client:
        batch = await client.messages.batches.create(requests=requests)
        await anyio.sleep(2.5)
        batch = await client.messages.batches.cancel(batch.id)
        assert batch.processing_status == "canceling"
        assert batch.cancel_initiated_at is not None
        await anyio.sleep(2)
        batch = await client.messages.batches.retrieve(batch.id)
        assert batch.processing_status == "ended"
        assert (batch.request_counts.succeeded, batch.request_counts.canceled) == (2, 3)
        results = [
            entry.result.type async for entry in await client.messages.batches.results(batch.id)
        ]
    assert results == ["succeeded", "succeeded", "canceled", "canceled", "canceled"]


@pytest.mark.parametrize(
    ("form", "status", "detail"),
    [
        ({"files": {"file": ("in.jsonl", b"{}\n")}, "data": {"purpose": "batch"}}, 200, "in.jsonl"),
        # A part without a filename is the file's content all the same.
        ({"files": {"file": (None, b"{}\n")}, "data": {"purpose": "batch"}}, 200, "upload.jsonl"),
        ({"files": {"file": ("in.jsonl", b"{}\n")}}, 400, "needs the fields 'file' and 'purpose'"),
        ({"json": {"file": "{}", "purpose": "batch"}}, 400, "expected a multipart/form-data body"),
    ],
)
async def test_a_file_upload_is_a_multipart_form(
    form: dict[str, Any], status: int, detail: str
) -> None:
    sim = SimulatedProvider()
    async with httpx2.AsyncClient(transport=sim.transport(), base_url="http://sim.test") as http:
        reply = await http.post("/v1/files", **form)
    assert reply.status_code == status
    assert detail in reply.text
    if status == 200:
        assert reply.json()["bytes"] == 3

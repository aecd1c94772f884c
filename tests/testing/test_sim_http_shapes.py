"""Structured output and both batch APIs through the official SDKs over real HTTP.

The in-process tests (test_sim_openai, test_sim_anthropic, test_sim_batches) cover
each shape in detail on virtual time; these prove the same shapes survive a real
socket and uvicorn, with a small time scale.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel

from coalesce.testing import BatchTiming, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

FAST = 0.001


@pytest.fixture
def anyio_backend(real_time_backend: Any) -> Any:
    return real_time_backend


class Tag(BaseModel):
    label: Literal["billing", "bug", "other"]
    urgent: bool


async def test_openai_structured_output_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    schema = Tag.model_json_schema()
    async with sim.serve_async() as url, sim.openai_client(url, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "the invoice is wrong"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "tag", "schema": schema, "strict": True},
            },
        )
    content = reply.choices[0].message.content or ""
    assert Tag.model_validate_json(content) == Tag.model_validate(
        expected_output("the invoice is wrong", schema)
    )


async def test_anthropic_forced_tool_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    schema = Tag.model_json_schema()
    async with sim.serve_async() as url, sim.anthropic_client(url, max_retries=0) as client:
        message = await client.messages.create(
            model="claude-x",
            max_tokens=200,
            messages=[{"role": "user", "content": "the app crashes"}],
            tools=[{"name": "tag", "description": "Tag it.", "input_schema": schema}],
            tool_choice={"type": "tool", "name": "tag"},
        )
    (block,) = message.content
    assert block.type == "tool_use"
    assert block.input == expected_output("the app crashes", schema)


async def test_openai_batch_api_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST, batches=BatchTiming(validating=10, per_request=1))
    lines = [
        {
            "custom_id": f"r{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"q{n}"}]},
        }
        for n in range(3)
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    async with sim.serve_async() as url, sim.openai_client(url, max_retries=0) as client:
        upload = await client.files.create(file=("in.jsonl", body), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with anyio.fail_after(10):
            while batch.status != "completed":
                await anyio.sleep(0.01)
                batch = await client.batches.retrieve(batch.id)
        assert batch.output_file_id
        output = (await client.files.content(batch.output_file_id)).text.splitlines()
    answers = {
        json.loads(line)["custom_id"]: json.loads(line)["response"]["body"]["choices"][0][
            "message"
        ]["content"]
        for line in output
    }
    assert answers == {f"r{n}": expected_output(f"q{n}") for n in range(3)}


async def test_anthropic_message_batches_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST, batches=BatchTiming(validating=10, per_request=1))
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
    async with sim.serve_async() as url, sim.anthropic_client(url, max_retries=0) as client:
        batch = await client.messages.batches.create(requests=requests)
        with anyio.fail_after(10):
            while batch.processing_status != "ended":
                await anyio.sleep(0.01)
                batch = await client.messages.batches.retrieve(batch.id)
        results = {
            entry.custom_id: entry.result
            async for entry in await client.messages.batches.results(batch.id)
        }
    for n in range(3):
        result: Any = results[f"m{n}"]
        assert result.type == "succeeded"
        assert result.message.content[0].text == expected_output(f"q{n}")

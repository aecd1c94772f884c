"""What the gateway does not coalesce reaches the upstream, and comes back, untouched:
other paths (files, batches, models, ...) byte for byte, and calls ``wrap`` passes
through as the upstream answered them, streamed ones included."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest
from _serving import Recorder, Running
from _traffic import chat_body

from coalesce.testing import SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True),
]

_KEY = {"authorization": "Bearer sk-team"}


def _same(text: bytes) -> bytes:
    """``text`` without what differs from one request to the next (ids, timestamps)."""
    text = re.sub(rb"sim\d+", b"sim", text)
    return re.sub(rb'"created": ?\d+', b'"created": 0', text)


async def _both(
    sim_url: str, gateway: Running, method: str, path: str, **options: Any
) -> tuple[httpx.Response, httpx.Response]:
    async with httpx.AsyncClient() as http:
        direct = await http.request(method, f"{sim_url}{path}", **options)
        through = await http.request(method, f"{gateway.url}{path}", **options)
    return direct, through


async def test_other_paths_are_proxied_byte_for_byte(
    sim_url: str, recorder: Recorder, gateway: Running
) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    lines = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    uploaded = await client.files.create(file=("lines.jsonl", lines), purpose="batch")
    await client.close()
    upload = recorder.seen[-1]
    assert (upload.method, upload.path, upload.key) == ("POST", "/v1/files", "sk-team")
    assert lines in upload.body  # the multipart body, as the SDK wrote it
    for path in (
        f"/v1/files/{uploaded.id}/content",
        f"/v1/files/{uploaded.id}",
        "/v1/batches?limit=2",
        "/v1/models",
    ):
        direct, through = await _both(
            sim_url, gateway, "GET", path, headers={**_KEY, "x-custom": "kept"}
        )
        assert through.status_code == direct.status_code
        assert through.content == direct.content
        assert through.headers["content-type"] == direct.headers["content-type"]
        seen = recorder.seen[-1]
        assert seen.path + (f"?{seen.query}" if seen.query else "") == path
        assert (seen.key, seen.headers["x-custom"]) == ("sk-team", "kept")
    assert direct.status_code == 404  # /v1/models: the simulator has none, and says so


async def test_a_call_wrap_passes_through_gets_the_upstreams_own_reply(
    sim_url: str, gateway: Running
) -> None:
    body = chat_body("Ticket 3: hello", n=2)  # n > 1: not coalesced
    direct, through = await _both(
        sim_url, gateway, "POST", "/v1/chat/completions", json=body, headers=_KEY
    )
    assert through.status_code == direct.status_code == 200
    assert _same(through.content) == _same(direct.content)
    assert through.headers["x-coalesce-group-size"] == "1"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat_body("Ticket 4: hello", stream=True, logprobs=True)),
        ("/v1/chat/completions", chat_body("Ticket 5: hello", stream=True, unknown_field=1)),
    ],
)
async def test_a_passed_through_stream_is_relayed_event_for_event(
    sim: SimulatedProvider,
    sim_url: str,
    recorder: Recorder,
    gateway: Running,
    path: str,
    body: dict[str, Any],
) -> None:
    direct, through = await _both(sim_url, gateway, "POST", path, json=body, headers=_KEY)
    # The upstream was sent the body the client sent, fields the SDK does not know too.
    assert json.loads(recorder.seen[1].body) == json.loads(recorder.seen[0].body) == body
    assert through.headers["content-type"].startswith("text/event-stream")
    assert _same(through.content) == _same(direct.content)
    assert through.content.endswith(b"data: [DONE]\n\n")
    assert [record.stream for record in sim.requests] == [True, True]

"""``coalesce serve`` as a process: SIGTERM lets the calls in flight finish; ``kill -9``
leaves no client hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import openai
import pytest
from _traffic import Ticket, chat_body, expected_ticket, tickets

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True),
]

#: The clients' own timeout: no call may wait that long for a dead gateway.
SDK_TIMEOUT = 20.0
CALLS = 8


@asynccontextmanager
async def gateway_process(
    sim_url: str, log: Path, *flags: str
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """``coalesce serve`` in front of the simulator, in a process of its own."""
    command = [
        sys.executable, "-m", "coalesce", "serve", "--port", "0", "--max-items", "20",
        "--openai-upstream", f"{sim_url}/v1", "--anthropic-upstream", sim_url, *flags,
    ]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        with log.open("wb") as errors:
            return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors)

    process = await anyio.to_thread.run_sync(start)
    try:
        assert process.stdout is not None
        line = await anyio.to_thread.run_sync(process.stdout.readline)
        if not line.startswith(b"coalesce gateway listening on "):
            pytest.fail(await anyio.Path(log).read_text())
        url = line.split()[-1].decode()
        await _until(url, lambda _: True)  # serving
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        await anyio.to_thread.run_sync(process.wait)
        process.stdout.close()  # type: ignore[union-attr]


async def _in_flight(url: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    for line in text.splitlines():
        if line.startswith("coalesce_gateway_calls_in_flight "):
            return float(line.split()[1])
    return 0.0


async def _until(url: str, done: Any) -> None:
    """Poll the gateway until ``done(calls in flight)``; a test guard, not a clock."""
    with anyio.fail_after(30):
        while True:
            try:
                if done(await _in_flight(url)):
                    return
            except httpx.TransportError:
                pass  # not accepting yet
            await anyio.sleep(0.05)


async def _calls(url: str) -> tuple[list[Any], anyio.Event, Any]:
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="sk", max_retries=0, timeout=SDK_TIMEOUT
    )
    outcomes: list[Any] = [None] * CALLS
    finished = anyio.Event()
    asked = tickets(CALLS)

    async def one(index: int) -> None:
        try:
            reply = await client.chat.completions.create(**chat_body(asked[index]))
            outcomes[index] = Ticket.model_validate_json(reply.choices[0].message.content or "")
        except openai.APIError as exc:
            outcomes[index] = exc

    async def run() -> None:
        async with anyio.create_task_group() as group:
            for index in range(CALLS):
                group.start_soon(one, index)
        await client.close()
        finished.set()

    return outcomes, finished, run


async def test_kill_9_leaves_no_client_hanging(sim_url: str, tmp_path: Path) -> None:
    async with httpx.AsyncClient() as http:  # the upstream never answers
        await http.post(f"{sim_url}/_sim/faults", json={"script": ["hang"] * CALLS})
    async with gateway_process(sim_url, tmp_path / "gateway.log", "--budget", "2") as (
        process,
        url,
    ):
        outcomes, finished, run = await _calls(url)
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await _until(url, lambda n: n == CALLS)
            os.kill(process.pid, signal.SIGKILL)
            with anyio.fail_after(SDK_TIMEOUT):
                await finished.wait()
    # The connection dropped at once: a connection error, not the SDK's timeout.
    assert [type(outcome) for outcome in outcomes] == [openai.APIConnectionError] * CALLS


async def test_sigterm_finishes_the_calls_in_flight(sim_url: str, tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    async with gateway_process(sim_url, log, "--budget", "4") as (process, url):
        outcomes, finished, run = await _calls(url)
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await _until(url, lambda n: n == CALLS)
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                await finished.wait()
        code = await anyio.to_thread.run_sync(process.wait)
    assert outcomes == [expected_ticket(ticket) for ticket in tickets(CALLS)]
    text = await anyio.Path(log).read_text()
    assert code == 0, text
    assert "Waiting for connections to close" in text  # the calls were still in flight
    assert "Application shutdown complete" in text

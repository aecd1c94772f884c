"""``coalesce serve --workers N``: N processes on one port coalesce as one process does,
over a NATS server of their own (none given with ``--fleet``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import openai
import pytest
from _traffic import CALLS, MOST_REQUESTS, Ticket, chat_body, expected_ticket, gather, tickets

import coalesce
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


async def test_two_workers_coalesce_as_one(sim: SimulatedProvider, sim_url: str) -> None:
    source = os.path.dirname(os.path.dirname(coalesce.__file__))
    command = [
        sys.executable, "-m", "coalesce", "serve", "--port", "0", "--workers", "2",
        "--budget", "2", "--max-items", "20", "--log-level", "warning",
        "--openai-upstream", f"{sim_url}/v1", "--anthropic-upstream", sim_url,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": source}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)  # noqa: ASYNC220
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("coalesce gateway listening on "), line
        url = line.split()[-1]
        # A client per call: each its own connection, spread by the kernel over the workers.
        asked = tickets()

        async def one(index: int) -> Ticket:
            async with openai.AsyncOpenAI(
                base_url=f"{url}/v1", api_key="sk-team", max_retries=5
            ) as client:
                reply = await client.chat.completions.create(**chat_body(asked[index]))
            return Ticket.model_validate_json(reply.choices[0].message.content or "")

        answers = await gather(list(range(CALLS)), one)
        assert answers == [expected_ticket(ticket) for ticket in asked]
        assert sum(r.items for r in sim.requests) == CALLS
        assert len(sim.requests) <= MOST_REQUESTS, [r.items for r in sim.requests]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        if process.stdout is not None:
            process.stdout.close()

"""The lanes through the gateway (issue 23): ``x-coalesce-lane`` per call, flex and the
batch lane on ``--store``; ``kill -9`` of a gateway with a batch job in flight, then a
gateway on the same store finishes it, each item sent to the provider once.

The kill tests run ``coalesce serve`` and the simulator (``coalesce simulate``, whose
batches outlive the gateway) as processes of their own, at a time scale that makes a
batch line 0.4 s, so that the job is killed while it is polled. Nothing here asserts a
duration.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from _lanes_gateway import in_background, job_states, post_all, start_gateway, wait_for
from _serving import Recorder, gateway_config, serving
from _traffic import Ticket, chat_body, expected_ticket, tickets

from coalesce._demo import simulated_provider

pytestmark = [pytest.mark.anyio]

N = 8  # calls; --max-items 4: two lines of four
FAST = ("--batch-window", "0.5", "--poll-interval", "0.2")
KEY = {"authorization": "Bearer sk-sim"}


def answers(replies: list[Any]) -> list[Ticket]:
    return [
        Ticket.model_validate_json(r.json()["choices"][0]["message"]["content"]) for r in replies
    ]


def submissions(url: str) -> list[dict[str, Any]]:
    batches: list[dict[str, Any]] = httpx.get(f"{url}/_sim/stats").json()["batches"]
    return batches


def lines_sent(url: str) -> list[str]:
    return [cid for batch in submissions(url) for cid in batch["custom_ids"]]


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_each_header_lane_is_honoured(
    sim_url: str, recorder: Recorder, tmp_path: Path
) -> None:
    config = gateway_config(
        sim_url, max_items=4, store=tmp_path / "jobs.sqlite3", batch_window=0.3, poll_interval=0.2
    )
    asked = tickets(4)
    async with serving(config) as running, httpx.AsyncClient(timeout=60) as http:

        async def post(ticket: str, lane: str) -> httpx.Response:
            headers = {**KEY, "x-coalesce-lane": lane}
            return await http.post(
                f"{running.openai_url}/chat/completions", json=chat_body(ticket), headers=headers
            )

        flex = await post(asked[0], "flex")
        batch = await post(asked[1], "batch")
        auto = await post(asked[2], "auto")  # no budget beyond 2 s: real time
        bad = await post(asked[3], "later")
    for reply, ticket in ((flex, asked[0]), (batch, asked[1]), (auto, asked[2])):
        assert reply.status_code == 200, reply.text
        assert Ticket.model_validate_json(reply.json()["choices"][0]["message"]["content"]) == (
            expected_ticket(ticket)
        )
    assert flex.headers["x-coalesce-lane"] in ("flex", "realtime")  # realtime: refused
    assert batch.headers["x-coalesce-lane"] == "batch"
    assert auto.headers["x-coalesce-lane"] == "realtime"
    assert bad.status_code == 400
    assert "x-coalesce-lane" in bad.text
    posted = [seen for seen in recorder.seen if seen.path == "/v1/chat/completions"]
    assert b'"service_tier":"flex"' in posted[0].body.replace(b" ", b"")
    assert any(seen.path == "/v1/batches" for seen in recorder.seen)


def _kill_with_a_job_in_flight(
    sim: str, store: Path, log: Path, *flags: str, env: Any = None
) -> list[Any]:
    """Start a gateway, send N batch-lane calls, kill it -9 once their job is submitted;
    what the calls got (each broke off)."""
    process, url = start_gateway(sim, log, "--store", str(store), *FAST, *flags, env=env)
    bodies = [chat_body(ticket) for ticket in tickets(N)]
    got: list[Any] = []
    calls = in_background(
        lambda: got.extend(post_all(url, bodies, {**KEY, "x-coalesce-lane": "batch"}))
    )
    try:
        wait_for(lambda: job_states(store) == ["submitted"], "the job to be submitted")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()  # type: ignore[union-attr]
    calls.join(60)
    assert process.returncode == -signal.SIGKILL
    return got


@pytest.mark.slow
def test_a_restarted_gateway_finishes_its_batch_job_when_its_callers_ask_again(
    tmp_path: Path,
) -> None:
    # Each call's own credential travels with it: the jobs are adopted by the lane of
    # that credential, when its calls come back (as an SDK retries them).
    store, log = tmp_path / "jobs.sqlite3", tmp_path / "gateway.log"
    with simulated_provider(time_scale=0.001, batches={"per_request": 400.0}) as sim:
        broken = _kill_with_a_job_in_flight(sim, store, log)
        assert all(isinstance(outcome, httpx.HTTPError) for outcome in broken)
        assert job_states(store) == ["submitted"]
        process, url = start_gateway(sim, log, "--store", str(store), *FAST)
        try:
            bodies = [chat_body(ticket) for ticket in tickets(N)]
            replies = post_all(url, bodies, {**KEY, "x-coalesce-lane": "batch"})
        finally:
            process.terminate()
            process.wait(30)
            process.stdout.close()  # type: ignore[union-attr]
        assert [r.status_code for r in replies] == [200] * N
        assert answers(replies) == [expected_ticket(t) for t in tickets(N)]
        assert job_states(store) == ["completed"]
        assert len(submissions(sim)) == 1  # the restarted gateway submitted nothing
        sent = lines_sent(sim)
        assert len(sent) == 2
        assert len(set(sent)) == 2


@pytest.mark.slow
def test_a_restarted_gateway_holding_the_key_finishes_its_job_at_startup(tmp_path: Path) -> None:
    # --api-key mode: the gateway holds the upstream key, so it finishes the jobs an
    # earlier gateway left as soon as it starts, with no call asking.
    store, log = tmp_path / "jobs.sqlite3", tmp_path / "gateway.log"
    env = {**os.environ, "OPENAI_API_KEY": "sk-sim", "COALESCE_API_KEYS": "sk-sim"}
    with simulated_provider(time_scale=0.001, batches={"per_request": 400.0}) as sim:
        _kill_with_a_job_in_flight(sim, store, log, env=env)
        assert job_states(store) == ["submitted"]
        process, url = start_gateway(sim, log, "--store", str(store), *FAST, env=env)
        try:
            wait_for(lambda: job_states(store) == ["completed"], "the adopted job to finish")
            bodies = [chat_body(ticket) for ticket in tickets(N)]
            replies = post_all(url, bodies, {**KEY, "x-coalesce-lane": "batch"})
        finally:
            process.terminate()
            process.wait(30)
            process.stdout.close()  # type: ignore[union-attr]
        assert answers(replies) == [expected_ticket(t) for t in tickets(N)]  # from the store
        assert len(submissions(sim)) == 1
        sent = lines_sent(sim)
        assert len(sent) == 2
        assert len(set(sent)) == 2

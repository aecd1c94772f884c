"""Real-time traffic: a small web endpoint behind a live copilot feature.

A person is waiting, so this path has its own function with a tight latency budget:
the planner only groups calls that can still answer within it, and sends a call alone
when it cannot. Its one-line instructions are too short for packing to pay, so coalesce
says so once (a ``CoalesceWarning``) and sends every call at once, as a plain call: no
added wait and no extra cost. A call still unanswered at its deadline gets
``coalesce.RequestTimeoutError``, and the endpoint answers 504. Background work (see `nightly_tagging.py`) uses a different function,
ideally a different API key, so that it never eats this path's rate limit.

Run it with ``python examples/copilot_endpoint.py``: it serves a plain ASGI app with
uvicorn on a free port of 127.0.0.1 backed by the simulated provider, sends it a burst of
concurrent requests, prints what they got, and stops.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import anyio
import httpx

import coalesce
from coalesce.testing import SimulatedProvider

sim = SimulatedProvider(time_scale=0.1)


@coalesce.prompt(
    client=sim.openai_client(),
    model="gpt-4o-mini",
    latency_budget=0.8,  # a person is waiting
    max_wait=0.02,  # wait at most 20 ms for company
    max_items=4,
)
async def suggest(draft: str) -> str:  # type: ignore[empty-body]
    """Suggest a one-sentence completion of the user's draft reply."""


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """POST /suggest {"draft": "..."} -> {"suggestion": "..."}."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    draft = json.loads(body or b"{}").get("draft", "")
    try:
        status, answer = 200, {"suggestion": await suggest(draft)}
    except coalesce.RequestTimeoutError:  # out of budget: the person gets no suggestion
        status, answer = 504, {"error": "no suggestion in time"}
    payload = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": payload})


async def main() -> None:
    import uvicorn

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        while not server.started:
            await anyio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            replies: list[str] = []
            late = 0

            async def ask(n: int) -> None:
                nonlocal late
                response = await http.post("/suggest", json={"draft": f"Thanks for {n}"})
                if response.status_code == 200:
                    replies.append(response.json()["suggestion"])
                else:
                    late += 1

            async with anyio.create_task_group() as burst:
                for n in range(12):
                    burst.start_soon(ask, n)
        server.should_exit = True
    stats = suggest.statistics()
    print(f"{len(replies) + late} calls answered: {len(replies)} suggestions,"
          f" {late} out of time; {stats.requests} provider requests;"
          f" p95 {stats.latency_p95 * 1000:.0f} ms within a {0.8 * 1000:.0f} ms budget:"
          f" {stats.within_budget:.0%}")  # fmt: skip


if __name__ == "__main__":
    anyio.run(main)

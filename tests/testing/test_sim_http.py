"""The simulator over real HTTP (uvicorn in a thread), its CLI and its pytest plugin.

Real sockets need the real clock: these tests run on ``real_time_backend`` and give
the provider a tiny time scale.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx2
import openai
import pytest

from coalesce.testing import FaultPlan, RateLimit, SimulatedProvider, expected_output
from coalesce.testing._cli import main

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
FAST = 0.001
SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)


@pytest.fixture
def anyio_backend(real_time_backend: Any) -> Any:
    return real_time_backend


async def _complete(client: openai.AsyncOpenAI, *, stream: bool) -> None:
    """One chat completion, read to the end."""
    reply = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=stream
    )
    if stream:
        async for _ in reply:  # type: ignore[union-attr]
            pass


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("coalesce-sim")]


async def _wait_for(predicate: Any) -> None:
    """Wait until the server thread has done something; bounded, not a clock."""
    with anyio.fail_after(5):
        while not predicate():  # noqa: ASYNC110 - set by the server's thread, not ours
            await anyio.sleep(0.01)


def test_serve_starts_and_stops() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    with sim.serve() as url:
        assert url.startswith("http://127.0.0.1:")
        response = httpx2.get(url + "/")
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
        assert _server_threads()
    assert not _server_threads()
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(url + "/")


def test_a_busy_port_fails_fast() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    with sim.serve() as url:
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(OSError, match=r"[Aa]ddress"), sim.serve(port=port):
            pass


@SDK_STREAMS
async def test_openai_sdk_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST, rate_limits=RateLimit(requests_per_minute=100))
    items = [{"id": str(n), "input": n} for n in range(3)]
    async with sim.serve_async() as url:
        async with sim.openai_client(url, max_retries=0) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": json.dumps(items)}]
            )
            assert raw.headers["x-ratelimit-remaining-requests"] == "99"
            reply = raw.parse()
            expected = {"results": {str(n): expected_output(n) for n in range(3)}}
            assert json.loads(reply.choices[0].message.content or "") == expected
            stream = await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            assert text == expected_output("hi")
        async with httpx2.AsyncClient(base_url=url) as http:
            stats = (await http.get("/_sim/stats")).json()
            assert stats["totals"]["requests"] == 2
            assert stats["totals"]["items"] == 4
            await http.post("/_sim/reset")
    assert sim.statistics().requests == 0


async def test_anthropic_sdk_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    with sim.serve() as url:
        async with sim.anthropic_client(url, max_retries=0) as client:
            async with client.messages.stream(
                model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "hello"}]
            ) as stream:
                text = "".join([piece async for piece in stream.text_stream])
            assert text == expected_output("hello")


@SDK_STREAMS
@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_over_http(stream: bool) -> None:
    sim = SimulatedProvider(time_scale=FAST, output_tokens=300)
    sim.inject("disconnect")
    async with sim.serve_async() as url, sim.openai_client(url, max_retries=0) as client:
        with pytest.raises(openai.APIConnectionError):
            await _complete(client, stream=stream)
    assert sim.requests[-1].faults == ("disconnect",)


async def test_hang_times_the_client_out_and_the_server_notices() -> None:
    sim = SimulatedProvider(time_scale=FAST, faults=FaultPlan(script=["hang"], hang_seconds=60_000))
    async with sim.serve_async() as url:
        async with sim.anthropic_client(url, max_retries=0, timeout=0.2) as client:
            with pytest.raises(anthropic.APITimeoutError):
                await client.messages.create(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
        await _wait_for(lambda: sim.requests)
    (record,) = sim.requests
    assert (record.status, record.faults) == (499, ("hang",))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


@pytest.mark.slow
def test_cli_serves_until_terminated(tmp_path: Path) -> None:
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({"time_scale": 0.001, "faults": {"script": ["server_error"]}}))
    code = "import sys; from coalesce.testing._cli import main; sys.exit(main(sys.argv[1:]))"
    with subprocess.Popen(
        [sys.executable, "-c", code, "simulate", "--port", "0", "--config", str(config)],
        stdout=subprocess.PIPE, text=True, env=_env(),
    ) as process:  # fmt: skip
        try:
            assert process.stdout is not None
            url = process.stdout.readline().split()[-1]
            assert httpx2.get(url + "/").json()["time_scale"] == 0.001
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            assert httpx2.post(url + "/v1/chat/completions", json=body).status_code == 500
            assert httpx2.post(url + "/v1/chat/completions", json=body).status_code == 200
        finally:
            process.terminate()
        assert process.wait(timeout=10) == 0


def test_cli_reports_configuration_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"speed": 1}')
    assert main(["--config", str(bad)]) == 2
    assert "unknown simulator configuration keys" in capsys.readouterr().err


@pytest.mark.slow
def test_the_pytest_plugin_and_the_example_work() -> None:
    example = ROOT / "examples" / "test_with_simulator.py"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:looptime_plugin", str(example)],
        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout


async def test_serving_builds_the_app_before_the_first_request() -> None:
    """The app (and the token counter it loads, half a second or so) is ready when the
    server starts: the first reply's latency is the simulated model's, which the
    planner learns from, not the simulator's set-up."""
    sim = SimulatedProvider(time_scale=FAST)
    assert "_app" not in vars(sim)  # built lazily in process
    async with sim.serve_async():
        assert "_app" in vars(sim)
        assert not sim.requests
    with sim.serve():
        assert "_app" in vars(sim)

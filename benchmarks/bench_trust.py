"""Trust: every caller gets its own right answer, or a clear error of its own (issue 12).

Four scenarios against the simulated provider, each printing a Markdown table:

* ``faults``: ``--calls`` calls (default 400) arrive as a Poisson stream and meet a
  provider that ignores the reply schema: per request, duplicate ids with the wrong
  answer first, missing, extra and shuffled ids, code fences, malformed JSON, 429 and
  500 (seeded). Through ``@coalesce.prompt`` (openai SDK) and streamed
  ``coalesce.wrap`` calls with the openai SDK (``json_schema`` response format) and the
  anthropic SDK (forced tool); then ``stream=False`` and ``schema_enforced=True`` as
  comparison rows. Each caller's answer is compared with the simulated model's own
  (:func:`coalesce.testing.expected_output`). Target: 0 wrong, >= 99% correct.
* ``holding``: the same load without faults, ``schema_enforced=True`` (answers stream
  as soon as they are written) against ``False`` (held until the reply can no longer
  contradict them): p50/p95 and the ratio held/streamed.
* ``poison``: one poison item (NaN, infinity, a lone surrogate, bytes, ``object()``, a
  1 MB string) among 9 innocent concurrent calls, through ``prompt`` and ``wrap``:
  innocent answers, the poison caller's outcome, requests sent. Target: 9 correct,
  1 clear error.
* ``hang``: a provider that never answers, ``latency_budget=1`` and, separately,
  ``timeout=2``; in process and over HTTP, on asyncio and on trio: the latest time a
  caller is freed and its exception. Target: within the limit + 0.1 s.

The provider runs in its own process and is reached over real HTTP (``coalesce
simulate``: time to first token 0.35 s, 80 tokens/s); the hang scenario also runs it
in process. Every scenario is independent: a row that cannot run (an option the
library does not have yet) prints its error and the others go on. About 4 minutes.

Run: ``python benchmarks/bench_trust.py [--calls 400] [--scenario all] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anthropic
import anyio
import httpx
import openai
from pydantic import BaseModel

import coalesce
from coalesce._demo import at_arrivals, simulated_provider
from coalesce.testing import FaultPlan, SimulatedProvider, expected_output

MODEL = "gpt-4o-mini"  # a 128k-token context window
CLAUDE = "claude-3-5-haiku-latest"
LOCAL = "local-llm"  # a model the library's table of context windows does not know
INSTRUCTIONS = "Decide whether each mail is spam or ham, and score how sure you are from 0 to 1000."
#: Groups of up to 8 (not the default 4): with this one-line instruction, packing pays
#: from 5 items, and the benchmark measures faults in packed replies.
MAX_ITEMS = 8
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["spam", "ham"]},
        "score": {"type": "integer"},
    },
    "required": ["label", "score"],
    "additionalProperties": False,
}
FAULTS = {
    "duplicate_id_wrong_first": 0.08,
    "missing_item": 0.06,
    "extra_id": 0.06,
    "out_of_order": 0.06,
    "code_fence": 0.06,
    "malformed_json": 0.06,
    "rate_limit": 0.06,
    "server_error": 0.06,
}
GUARD = 60.0  # the benchmark's own limit on one call, so that no row can hang it
POISON_GUARD = 30.0


class Verdict(BaseModel):
    label: Literal["spam", "ham"]
    score: int


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- one way of calling: an ``ask(item) -> answer`` ----------------------------------

Ask = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True)
class Garbled:
    """A caller got a reply that is not even JSON: a wrong answer, not an error."""

    text: str


def parse_answer(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return Garbled(text)


@dataclass
class Caller:
    """An ``ask`` and what closes its client."""

    ask: Ask
    close: Callable[[], Awaitable[None]]


def openai_sdk(url: str | None, sim: SimulatedProvider | None = None) -> openai.AsyncOpenAI:
    if sim is not None:
        return sim.openai_client()
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim")


def anthropic_sdk(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-sim")


def via_prompt(client: Any, options: Mapping[str, Any]) -> Caller:
    settings = {"model": MODEL, "instructions": INSTRUCTIONS, "max_items": MAX_ITEMS, **options}

    @coalesce.prompt(client=client, **settings)
    async def verdict(mail: Any) -> Verdict:  # type: ignore[empty-body]
        """(instructions= above)"""

    async def ask(item: Any) -> Any:
        return (await verdict(item)).model_dump()

    async def close() -> None:
        # prompt's aclose() leaves the client to its owner (wrap's closes it). Left to the
        # garbage collector, an SDK client closes its sockets in __del__ and schedules an
        # aclose() whose aborts unregister the fds a later row's connections reuse: those
        # requests never see their reply and wait out the 60 s timeout.
        await verdict.aclose()
        await client.close()

    return Caller(ask, close)


def chat_kwargs(item: Any, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": item},
        ],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": SCHEMA},
        },
    }


def via_wrap_openai(client: Any, options: Mapping[str, Any], stream: bool) -> Caller:
    settings = {"max_items": MAX_ITEMS, **options}
    model = settings.pop("model", MODEL)
    wrapped: Any = coalesce.wrap(client, **settings)

    async def ask(item: Any) -> Any:
        if not stream:
            reply = await wrapped.chat.completions.create(**chat_kwargs(item, model))
            return parse_answer(reply.choices[0].message.content or "")
        chunks = await wrapped.chat.completions.create(**chat_kwargs(item, model), stream=True)
        pieces = [c.choices[0].delta.content or "" async for c in chunks if c.choices]
        return parse_answer("".join(pieces))

    return Caller(ask, wrapped.aclose)


def tool_kwargs(item: Any, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 200,
        "system": INSTRUCTIONS,
        "messages": [{"role": "user", "content": item}],
        "tools": [{"name": "verdict", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "verdict"},
    }


def via_wrap_anthropic(client: Any, options: Mapping[str, Any], stream: bool) -> Caller:
    settings = {"max_items": MAX_ITEMS, **options}
    model = settings.pop("model", CLAUDE)
    wrapped: Any = coalesce.wrap(client, **settings)

    async def ask(item: Any) -> Any:
        if not stream:
            message = await wrapped.messages.create(**tool_kwargs(item, model))
            block = message.content[0]
            return dict(block.input) if block.type == "tool_use" else Garbled(block.text)
        events = await wrapped.messages.create(**tool_kwargs(item, model), stream=True)
        pieces = [
            e.delta.partial_json
            async for e in events
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        return parse_answer("".join(pieces))

    return Caller(ask, wrapped.aclose)


@dataclass(frozen=True)
class Way:
    """A row's way of calling: a name, and how to build its caller for a base URL."""

    name: str
    build: Callable[[str], Caller]


def way(name: str, via: str, stream: bool = True, **options: Any) -> Way:
    if via == "prompt":
        opts = {**options, **({} if stream else {"stream": False})}
        return Way(name, lambda url: via_prompt(openai_sdk(url), opts))
    if via == "openai":
        return Way(name, lambda url: via_wrap_openai(openai_sdk(url), options, stream))
    return Way(name, lambda url: via_wrap_anthropic(anthropic_sdk(url), options, stream))


# -- tallies --------------------------------------------------------------------------


@dataclass
class Tally:
    """What the callers of one row got."""

    latencies: list[float] = field(default_factory=list)
    correct: int = 0
    wrong: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    setup: str | None = None  # the row could not start

    @property
    def calls(self) -> int:
        return self.correct + self.wrong + sum(self.errors.values())

    def add(self, answer: Any, expected: Any, elapsed: float) -> None:
        self.latencies.append(elapsed)
        if isinstance(answer, BaseException):
            self.errors[type(answer).__name__] += 1
        elif answer == expected:
            self.correct += 1
        else:
            self.wrong += 1


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def error_text(errors: collections.Counter[str]) -> str:
    return ", ".join(f"{name} x{n}" for name, n in errors.most_common()) or "none"


def short(exc: BaseException, limit: int = 90) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def timed(ask: Ask, item: Any, guard: float) -> tuple[Any, float]:
    """The answer (or the exception) and the seconds it took."""
    start = time.perf_counter()
    answer: Any = TimeoutError(f"no answer within the benchmark's {guard:g} s guard")
    with anyio.move_on_after(guard):
        try:
            answer = await ask(item)
        except Exception as exc:
            answer = exc
    return answer, time.perf_counter() - start


# -- the simulator over HTTP ----------------------------------------------------------


def sim_get(url: str, path: str) -> Any:
    return httpx.get(f"{url}{path}", timeout=10).json()


def sim_reset(url: str) -> None:
    httpx.post(f"{url}/_sim/reset", timeout=10)


def mails(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    topics = ["invoice", "prize", "meeting", "password", "refund", "newsletter", "lottery"]
    return [
        f"Mail #{i}: about the {rng.choice(topics)}, sent {rng.randrange(1, 28)} May."
        for i in range(n)
    ]


def poisson(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    at, out = 0.0, []
    for _ in range(n):
        at += rng.expovariate(rate)
        out.append(at)
    return out


async def run_load(url: str, w: Way, items: list[str], arrivals: list[float]) -> Tally:
    """One row: every item at its arrival time through ``w``; the answers checked."""
    sim_reset(url)
    tally = Tally()
    try:
        caller = w.build(url)
    except Exception as exc:
        tally.setup = short(exc)
        return tally

    async def one(item: str) -> None:
        answer, elapsed = await timed(caller.ask, item, GUARD)
        tally.add(answer, expected_output(item, SCHEMA), elapsed)

    await at_arrivals(arrivals, items, one)
    await caller.close()
    return tally


def row_cells(t: Tally) -> str:
    if t.setup is not None:
        return f"not run: {t.setup} | | | | | |"
    share = t.correct / t.calls if t.calls else math.nan
    return (
        f"{t.calls} | {t.correct} | {t.wrong} | {error_text(t.errors)} | {share:.1%}"
        f" | {quantile(t.latencies, 0.5):.2f} s | {quantile(t.latencies, 0.95):.2f} s"
    )


# -- a. wrong answers under schema-ignoring faults ------------------------------------


def fault_cells(url: str) -> str:
    """Requests, and the faults injected (those that wrote an id twice, wrong first)."""
    stats = sim_get(url, "/_sim/stats")
    first = sum("duplicate_id_wrong_first" in r["faults"] for r in stats["requests"])
    return f"{stats['totals']['requests']} | {stats['totals']['faults']} ({first})"


FAULT_WAYS = [
    way("prompt, streamed (default)", "prompt"),
    way("wrap openai, stream=True", "openai"),
    way("wrap anthropic (tool), stream=True", "anthropic"),
    way("prompt, stream=False", "prompt", stream=False),
    way("wrap openai, stream=False", "openai", stream=False),
    way("wrap anthropic (tool), stream=False", "anthropic", stream=False),
    way("prompt, streamed, schema_enforced=False", "prompt", schema_enforced=False),
    way("prompt, streamed, schema_enforced=True", "prompt", schema_enforced=True),
    way("wrap openai, stream=True, schema_enforced=True", "openai", schema_enforced=True),
    way("wrap anthropic, stream=True, schema_enforced=True", "anthropic", schema_enforced=True),
]


async def scenario_faults(args: argparse.Namespace) -> None:
    items, arrivals = mails(args.calls, args.seed), poisson(args.calls, args.rate, args.seed)
    faults = {"probabilities": FAULTS, "seed": args.seed}
    print(
        f"\n### a. Wrong answers under schema-ignoring faults\n\n{args.calls} calls, Poisson"
        f" arrivals at {args.rate:g}/s, simulated provider over HTTP (seed {args.seed});"
        " per request: " + ", ".join(f"{k} {v:.0%}" for k, v in FAULTS.items()) + ".\n"
    )
    print(
        "| way | calls | correct | wrong | errors | % correct | p50 | p95 | requests"
        " | faults (dup. wrong first) |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    with simulated_provider(faults=faults) as url:
        for w in FAULT_WAYS:
            log(f"faults: {w.name}")
            tally = await run_load(url, w, items, arrivals)
            print(f"| {w.name} | {row_cells(tally)} | {fault_cells(url)} |")


# -- b. the latency cost of holding answers -------------------------------------------

HOLDING_VIAS = [
    ("prompt", "prompt"),
    ("wrap openai, stream=True", "openai"),
    ("wrap anthropic (tool), stream=True", "anthropic"),
]


async def scenario_holding(args: argparse.Namespace) -> None:
    items, arrivals = mails(args.calls, args.seed), poisson(args.calls, args.rate, args.seed)
    print(
        f"\n### b. Latency cost of holding answers\n\n{args.calls} calls at {args.rate:g}/s,"
        " no faults, streamed; time to each caller's complete answer. Streamed:"
        " `schema_enforced=True` (answers go as soon as written); held:"
        " `schema_enforced=False` (until the reply can no longer contradict them).\n"
    )
    print(
        "| way | streamed p50 | streamed p95 | held p50 | held p95 | held/streamed p50"
        " | held/streamed p95 | correct (streamed, held) | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    with simulated_provider() as url:
        for name, via in HOLDING_VIAS:
            runs = {}
            for enforced in (True, False):
                log(f"holding: {name}, schema_enforced={enforced}")
                w = way(name, via, schema_enforced=enforced)
                runs[enforced] = await run_load(url, w, items, arrivals)
            print(holding_row(name, runs[True], runs[False]))


def holding_row(name: str, fast: Tally, held: Tally) -> str:
    def cells(t: Tally) -> tuple[float, float]:
        return quantile(t.latencies, 0.5), quantile(t.latencies, 0.95)

    (f50, f95), (h50, h95) = cells(fast), cells(held)
    setup = "; ".join(
        f"{label}: {t.setup}" for label, t in (("streamed", fast), ("held", held)) if t.setup
    )
    errors = {
        **{f"streamed {k}": v for k, v in fast.errors.items()},
        **{f"held {k}": v for k, v in held.errors.items()},
    }
    notes = setup or (", ".join(f"{k} x{v}" for k, v in errors.items()) or "none")
    return (
        f"| {name} | {f50:.2f} s | {f95:.2f} s | {h50:.2f} s | {h95:.2f} s | {h50 / f50:.2f}x"
        f" | {h95 / f95:.2f}x | {fast.correct}/{fast.calls}, {held.correct}/{held.calls} | {notes} |"
    )


# -- c. poison items ------------------------------------------------------------------


def megabyte() -> str:
    """About 1 MB of words: some 200k tokens, past a 128k-token context window."""
    rng = random.Random(0)
    words = ["river", "stone", "light", "paper", "window", "garden", "yellow", "seven"]
    text = " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(120_000))
    return text[: 1 << 20]


POISONS: list[tuple[str, Callable[[], Any], dict[str, Any]]] = [
    ("NaN", lambda: math.nan, {}),
    ("inf", lambda: math.inf, {}),
    ("lone surrogate", lambda: "hello \ud800 world", {}),
    ("bytes", lambda: b"\xff\xfe mail", {}),
    ("object()", object, {}),
    ("1 MB string (known windows: 128k, 200k)", megabyte, {}),
    ("1 MB string, context_window=16000", megabyte, {"context_window": 16_000}),
    ("1 MB string, unknown model (32k at the provider)", megabyte, {"model": LOCAL}),
]
#: What the simulated provider refuses as too long, as the real APIs would.
WINDOWS = {MODEL: 128_000, CLAUDE: 200_000, LOCAL: 32_000}
POISON_VIAS = [("prompt", "prompt"), ("wrap openai", "openai"), ("wrap anthropic", "anthropic")]


async def poison_row(url: str, via: str, poison: Any, options: Mapping[str, Any]) -> str:
    sim_reset(url)
    try:
        caller = way(via, via, max_wait=0.2, **options).build(url)
    except Exception as exc:
        return f"not run: {short(exc)} | | | |"
    innocents = [f"Mail #{i}: lunch on Friday?" for i in range(9)]
    items: list[Any] = [*innocents[:4], poison, *innocents[4:]]
    answers: list[Any] = [None] * len(items)

    async def one(index: int) -> None:
        answers[index], _ = await timed(caller.ask, items[index], POISON_GUARD)

    async with anyio.create_task_group() as group:
        for index in range(len(items)):
            group.start_soon(one, index)
    await caller.close()
    innocent = [a for i, a in enumerate(answers) if i != 4]
    right = sum(a == expected_output(x, SCHEMA) for a, x in zip(innocent, innocents, strict=True))
    errors = collections.Counter(type(a).__name__ for a in innocent if isinstance(a, BaseException))
    outcome = short(answers[4], 110) if isinstance(answers[4], BaseException) else "answered"
    totals = sim_get(url, "/_sim/stats")["totals"]
    return f"{right}/9 | {error_text(errors)} | {outcome} | {totals['requests']}"


async def scenario_poison(args: argparse.Namespace) -> None:
    print(
        "\n### c. Poison items\n\nOne poison among 9 innocent concurrent calls (`max_wait=0.2`,"
        " so they share a request); innocent answers checked; requests that reached the"
        " provider (which refuses prompts past 128k tokens for gpt-4o-mini, 200k for claude, 32k"
        " for local-llm, as a real API would).\n"
    )
    print("| poison | way | innocent correct | innocent errors | poison caller gets | requests |")
    print("|---|---|---:|---|---|---:|")
    with simulated_provider(context_window=WINDOWS) as url:
        for kind, make, options in POISONS:
            for name, via in POISON_VIAS:
                log(f"poison: {kind} via {name}")
                cells = await poison_row(url, via, make(), options)
                print(f"| {kind} | {name} | {cells} |")


# -- d. a provider that never answers -------------------------------------------------

HANG_LIMITS: list[tuple[str, dict[str, Any], float]] = [
    ("latency_budget=1", {"latency_budget": 1.0}, 1.0),
    ("timeout=2", {"timeout": 2.0}, 2.0),
]
HANG_CALLERS = 10


@dataclass(frozen=True)
class HangCase:
    backend: str
    transport: str
    via: str
    label: str
    options: Mapping[str, Any]
    limit: float


def hang_caller(case: HangCase, url: str | None, sim: SimulatedProvider | None) -> Caller:
    if case.via == "prompt":
        return via_prompt(openai_sdk(url, sim), case.options)
    return via_wrap_openai(openai_sdk(url, sim), case.options, stream=True)


async def hang_row(case: HangCase, url: str) -> str:
    sim = None
    if case.transport == "in process":
        plan = FaultPlan(probabilities={"hang": 1.0}, hang_seconds=math.inf)
        sim = SimulatedProvider(faults=plan)
    try:
        caller = hang_caller(case, None if sim else url, sim)
    except Exception as exc:
        return f"not run: {short(exc)} | | | |"
    freed: list[tuple[Any, float]] = []
    guard = case.limit + 3.0

    async def one(index: int) -> None:
        freed.append(await timed(caller.ask, f"Mail #{index}: are you there?", guard))

    async with anyio.create_task_group() as group:
        for index in range(HANG_CALLERS):
            group.start_soon(one, index)
    with anyio.move_on_after(5):
        await caller.close()
    latest = max(elapsed for _, elapsed in freed)
    kinds = collections.Counter(
        short(a, 70) if isinstance(a, BaseException) else "an answer (?)" for a, _ in freed
    )
    ok = latest <= case.limit + 0.1 and all(isinstance(a, coalesce.CoalesceError) for a, _ in freed)
    return (
        f"{latest:.2f} s | {case.limit + 0.1:.1f} s | {'yes' if ok else 'no'}"
        f" | {'; '.join(f'{k} x{n}' for k, n in kinds.most_common())}"
    )


def hang_cases() -> Iterator[HangCase]:
    for backend in ("asyncio", "trio"):
        for transport in ("in process", "HTTP"):
            for via in ("prompt", "wrap openai"):
                for label, options, limit in HANG_LIMITS:
                    yield HangCase(backend, transport, via, label, options, limit)


def scenario_hang(args: argparse.Namespace) -> None:
    print(
        f"\n### d. A provider that never answers\n\nEvery request hangs (`hang`,"
        f" `hang_seconds=inf`); {HANG_CALLERS} concurrent callers; the latest time a caller"
        " is freed, and what it gets (the benchmark gives up on a caller 3 s past its"
        " limit). Streamed wrap calls.\n"
    )
    print("| backend | provider | way | limit | latest freed | target | met | callers get |")
    print("|---|---|---|---|---:|---:|---|---|")
    hang = {"probabilities": {"hang": 1.0}, "hang_seconds": math.inf}
    with simulated_provider(faults=hang) as url:
        for case in hang_cases():
            log(f"hang: {case}")
            try:
                cells = anyio.run(hang_row, case, url, backend=case.backend)
            except Exception as exc:
                cells = f"failed: {short(exc)} | | |"
            print(f"| {case.backend} | {case.transport} | {case.via} | {case.label} | {cells} |")


# -- main -----------------------------------------------------------------------------

SCENARIOS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "faults": lambda args: anyio.run(scenario_faults, args),
    "holding": lambda args: anyio.run(scenario_holding, args),
    "poison": lambda args: anyio.run(scenario_poison, args),
    "hang": scenario_hang,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per row in faults, holding")
    parser.add_argument("--rate", type=float, default=100.0, help="arrivals per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenario", choices=["all", *SCENARIOS], default="all")
    args = parser.parse_args()
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)  # offline token counts
    warnings.simplefilter("ignore", ResourceWarning)  # SDK streams left to the collector
    chosen = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    for name in chosen:
        started = time.perf_counter()
        try:
            SCENARIOS[name](args)
        except Exception as exc:  # one scenario's crash does not stop the others
            print(f"\n**scenario {name} crashed**: {short(exc, 300)}\n")
        sys.stdout.flush()
        log(f"{name}: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    os.environ["COALESCE_STORE"] = ":memory:"  # learn afresh, keep nothing in the user's directory
    main()

"""Issue 38: coalesce's own CPU per call, by stage, with nothing else to wait for.

Every provider here answers at once, in process, so what a call costs is coalesce's
CPU (and the SDK's, where an SDK is in the path). Each row sends ``--calls`` (20,000)
concurrent calls (``asyncio.gather``) in a fresh event loop after a warm-up, and reads
``time.process_time`` around them: the CPU per call is the median of ``--rounds``
runs. The machine may be busy with other work, so each table also gives ratios, which
move less than the figures.

* ``@coalesce.prompt`` with an instant :class:`~coalesce.providers.CallableProvider`
  (``packing="always"``, ``max_wait=0.005``): alone (``max_items=1``), in groups of
  20 and of 64;
* ``coalesce.wrap`` of an ``openai.AsyncOpenAI`` on an in-process transport
  (``httpx2.MockTransport``, the HTTP library of the openai 3.x SDK), the same calls as
  chat completions, the same options; beside it the SDK's own CPU for the same call
  unwrapped, through the same transport;
* the gateway's coalesced path: ``coalesce serve``'s app in process, its upstream
  client on that transport, driven with raw ASGI calls at 1,000 calls/s with the process
  pinned to one core: the rate it keeps up, errors, the upstream group size and the
  CPU it used (the driver and the upstream's fake are in that process too);
* the batching layer alone: ``@coalesce.batch`` and aiodataloader 0.4.3 with a batch
  function that does nothing.

**By stage.** A second, smaller run of each ``prompt`` and ``wrap`` row with a profile
hook (``sys.setprofile``) charges each moment of CPU to the stage whose code runs, as
the call stack says (a stage's code calling a helper charges the helper to the stage):
bind and validate (the arguments read into an item), screen, plan (the job, its
budget and plan, the dispatch policy), batch (the batcher), runner (the group runner
itself), pack, send (retries, the provider, the SDK's HTTP for ``wrap``), the
upstream fake, split, settle, record (statistics and listeners), reply (``wrap``: the
SDK's own objects), and the rest (the event loop and the tasks). The hook slows every
function call alike, so it gives each stage's share; the table shows that share of the
measured CPU per call. It also counts, per call, what issue 38 named: regular
expression searches, anyio cancel scopes, ``sniffio.current_async_library`` look-ups,
``is_coroutine_callable`` checks, ``Random.seed`` calls, group runner runs, signature
binds.

Run: ``python benchmarks/bench_overhead.py`` (about 3 minutes), ``--quick`` (4,000
calls, 2 rounds, 2 s of gateway load; about a minute) or ``--smoke`` (a few calls of
each row, seconds: that it runs and prints; the test suite runs it). ``--only
prompt,wrap,gateway,batching`` picks sections. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any
from unittest import mock

import aiodataloader
import httpx2
import openai

import coalesce
from coalesce.providers import CallableProvider, CompletionRequest

MODEL = "gpt-4o-mini"
#: Shared instructions long enough (about 250 tokens) that packing pays for itself at
#: the gateway's default ``packing="auto"``, as it must for the gateway to coalesce.
INSTRUCTIONS = (
    "You label the sentiment of short movie reviews for a film website's weekly digest."
    " Read the review as its writer meant it: irony and sarcasm count for what they mean,"
    " not for the words they use, and a review that praises the actors but not the film is"
    " about the film. Answer positive when the writer, on balance, recommends seeing the"
    " film, and negative when the writer, on balance, does not. Mixed reviews are decided"
    " by their last judgement: what the writer says last is what the reader remembers."
    " Ignore remarks about the cinema, the price of the ticket, the audience, the trailer"
    " and the popcorn: they are not about the film. A review that only retells the plot"
    " without judging it is positive when it calls the story worth following and"
    " negative otherwise. Spelling mistakes, slang, capital letters and emoticons do not"
    " change the label; neither does the length of the review. Answer with one word,"
    " positive or negative, in lower case, without punctuation and without explanation."
)
ANSWER = "positive"
MAX_WAIT = 0.005
SIZES = (1, 20, 64)
GATEWAY_RATE = 1000.0
GATEWAY_MIN_GROUP = 4.0
TARGETS = {1: 300.0, 20: 80.0}  # prompt's CPU per call, microseconds
WRAP_RATIO_TARGET = 1.5
STAGES = (
    "bind and validate",
    "screen",
    "plan",
    "batch",
    "runner",
    "pack",
    "send",
    "the fakes (upstream, ASGI driver)",
    "split",
    "settle",
    "record",
    "reply (SDK objects)",
    "the drop-in client's own call",
    "HTTP (the gateway's app and routes)",
    "the rest (event loop, tasks)",
)

_WORDS = (
    "a gorgeous, aching film that earns every one of its tears",
    "the cast tries hard, but the script gives them nothing to do",
    "a clever, funny and surprisingly moving portrait of a family",
    "two long hours of noise with barely a story to hold it together",
)


def review(i: int) -> str:
    """The ``i``-th item: a review snippet of about 100 characters, each one distinct."""
    return f"{_WORDS[i % len(_WORDS)].capitalize()}; seen on day {i}, and I would say so again."


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the instant upstreams ---------------------------------------------------------------


def packed_items(user: str) -> list[dict[str, Any]] | None:
    """The ``{"id", "input"}`` items of a packed user message, or ``None`` (plain)."""
    if not user.startswith("["):
        return None
    try:
        value = json.loads(user)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, dict) and "id" in v for v in value):
        return value
    return None


def reply_text(user: str) -> tuple[str, int]:
    """The reply to a request's user message, and how many items it carried."""
    items = packed_items(user)
    if items is None:
        return ANSWER, 1
    return json.dumps({"results": {str(i["id"]): ANSWER for i in items}}), len(items)


@dataclass
class Upstream:
    """An instant model: answers every item ``positive``; counts requests and items."""

    requests: int = 0
    items: int = 0

    async def complete(self, request: CompletionRequest) -> str:
        """The :class:`~coalesce.providers.CallableProvider` function."""
        text, items = reply_text(request.user)
        self.requests += 1
        self.items += items
        return text

    def http(self, request: httpx2.Request) -> httpx2.Response:
        """The ``httpx2.MockTransport`` handler: an OpenAI chat completion."""
        body = json.loads(request.content)
        text, items = reply_text(body["messages"][-1]["content"])
        self.requests += 1
        self.items += items
        usage = {"prompt_tokens": 30 + 20 * items, "completion_tokens": 4 * items}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        message = {"role": "assistant", "content": text}
        return httpx2.Response(
            200,
            json={
                "id": f"chatcmpl-{self.requests}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            },
        )

    def sdk(self) -> openai.AsyncOpenAI:
        """An ``AsyncOpenAI`` whose requests this upstream answers in process."""
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(self.http))
        return openai.AsyncOpenAI(
            api_key="sk-bench", base_url="http://upstream.test/v1", http_client=http, max_retries=0
        )

    @property
    def group(self) -> float:
        return self.items / self.requests if self.requests else float("nan")


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": text}]


# -- what is measured: one kind of call, made in its loop ---------------------------------

Call = Callable[[int], Awaitable[Any]]


@dataclass
class Subject:
    """One row's calls: ``call(i)`` answers item ``i``; ``check`` says it is right."""

    call: Call
    close: Callable[[], Awaitable[Any]]
    check: Callable[[Any], bool]
    upstream: Upstream | None = None
    fake: tuple[CodeType, ...] = ()  # the upstream fake's own code, for the stages


def prompt_subject(size: int) -> Subject:
    upstream = Upstream()

    @coalesce.prompt(
        client=CallableProvider(upstream.complete),
        model=MODEL,
        instructions=INSTRUCTIONS,
        packing="always",
        max_wait=MAX_WAIT,
        max_items=size,
    )
    async def label(text: str) -> str:
        """(The instructions are given as ``instructions=``.)"""

    return Subject(
        lambda i: label(review(i)),
        label.aclose,
        lambda out: out == ANSWER,
        upstream,
        (Upstream.complete.__code__, reply_text.__code__),
    )


def wrap_subject(size: int) -> Subject:
    upstream = Upstream()
    client = coalesce.wrap(upstream.sdk(), packing="always", max_wait=MAX_WAIT, max_items=size)

    def call(i: int) -> Awaitable[Any]:
        return client.chat.completions.create(model=MODEL, messages=messages(review(i)))

    return Subject(
        call,
        client.close,
        lambda out: out.choices[0].message.content == ANSWER,
        upstream,
        (Upstream.http.__code__, reply_text.__code__),
    )


def sdk_subject() -> Subject:
    upstream = Upstream()
    client = upstream.sdk()

    def call(i: int) -> Awaitable[Any]:
        return client.chat.completions.create(model=MODEL, messages=messages(review(i)))

    return Subject(
        call, client.close, lambda out: out.choices[0].message.content == ANSWER, upstream
    )


async def _nothing() -> None:
    pass


async def no_op(items: list[int]) -> list[int]:
    return items


def batch_subject(size: int) -> Subject:
    f = coalesce.batch(max_items=size, max_wait=MAX_WAIT)(no_op)
    return Subject(f, f.aclose, lambda out: isinstance(out, int))


def dataloader_subject(size: int) -> Subject:
    loader: aiodataloader.DataLoader[int, int] = aiodataloader.DataLoader(
        no_op, max_batch_size=size, cache=False
    )
    return Subject(loader.load, _nothing, lambda out: isinstance(out, int))


# -- measuring -------------------------------------------------------------------------


@dataclass
class Measured:
    """CPU per call of one row's rounds (seconds), the garbage collector's part of it,
    and what the upstream saw."""

    cpu: list[float] = field(default_factory=list)
    collecting: list[float] = field(default_factory=list)
    group: float = float("nan")
    wrong: int = 0

    @property
    def us(self) -> float:
        return statistics.median(self.cpu) * 1e6 if self.cpu else float("nan")

    @property
    def gc_us(self) -> float:
        return statistics.median(self.collecting) * 1e6 if self.collecting else float("nan")


class Collections:
    """Seconds the garbage collector ran, while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.seconds += time.process_time() - self._start

    @contextlib.contextmanager
    def installed(self) -> Iterator[Collections]:
        gc.callbacks.append(self)
        try:
            yield self
        finally:
            gc.callbacks.remove(self)


@dataclass
class Run:
    cpu: float
    collecting: float
    subject: Subject
    wrong: int


async def _run(make: Callable[[], Subject], calls: int, warm: int) -> Run:
    subject = make()
    await asyncio.gather(*(subject.call(-1 - i) for i in range(warm)))
    if subject.upstream is not None:
        subject.upstream.requests = subject.upstream.items = 0
    gc.collect()
    with Collections().installed() as collections:
        start = time.process_time()
        results = await asyncio.gather(*(subject.call(i) for i in range(calls)))
        cpu = time.process_time() - start
    await subject.close()
    wrong = sum(not subject.check(out) for out in results)
    return Run(cpu / calls, collections.seconds / calls, subject, wrong)


def measure(make: Callable[[], Subject], calls: int, rounds: int, warm: int) -> Measured:
    """``rounds`` runs of ``calls`` concurrent calls, each in a fresh loop."""
    measured = Measured()
    for _ in range(rounds):
        run = asyncio.run(_run(make, calls, warm))
        measured.cpu.append(run.cpu)
        measured.collecting.append(run.collecting)
        measured.wrong += run.wrong
        if run.subject.upstream is not None:
            measured.group = run.subject.upstream.group
    return measured


# -- stages: a profile hook that charges CPU to the stage whose code runs -------------------


def _code(fn: Any) -> CodeType:
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return getattr(fn, "__func__", fn).__code__  # type: ignore[no-any-return]


def stage_entries() -> dict[CodeType, str]:
    """The code objects where a stage begins (anything they call is theirs too)."""
    from coalesce._engine import group
    from coalesce._engine.admission import ContextPolicy
    from coalesce._engine.engine import Engine
    from coalesce._lanes.router import LaneRouter
    from coalesce._observe.dispatch import DispatchListener
    from coalesce._observe.listeners import StatisticsListener, UsageShares
    from coalesce._observe.recorder import PromptRecorder
    from coalesce._planning.policy import BudgetPolicy
    from coalesce._prompt import PromptFunction
    from coalesce._wire.jsonstream import StreamSplitter
    from coalesce._wire.screen import checked_screen, looks_like_instructions
    from coalesce._wrap import client as wrap_client
    from coalesce._wrap import headers, raw, replies
    from coalesce._wrap.engines import Engines

    entries: dict[str, list[Any]] = {
        "bind and validate": [
            PromptFunction._item,
            PromptFunction._key,
            wrap_client.CoalescedClient._read,
            headers.coalesce_headers,
            raw.raw_mode,
        ],
        "screen": [checked_screen("f", looks_like_instructions), looks_like_instructions],
        "plan": [
            Engine.new_job,
            LaneRouter.submit,
            group.packs,
            group.last_attempts,
            *_methods(ContextPolicy),
            *_methods(BudgetPolicy),
        ],
        "runner": [Engine._run, group.run_group, group.ask, group.run_plain],
        "pack": [group.build],
        "send": [group.send],
        "split": [group.judge, StreamSplitter.feed],
        "settle": [group._apply, group._deliver],
        "record": [
            group._report,
            PromptRecorder.call_finished,
            StatisticsListener.follow,
            StatisticsListener.requests_of,
            DispatchListener.__call__,
            DispatchListener.forget,
            UsageShares.track,
            UsageShares.forget,
            *_observer_methods(),
        ],
        "reply (SDK objects)": [replies.openai_response, raw.raw_response],
        "the drop-in client's own call": [
            wrap_client.CoalescedClient._dispatch,
            wrap_client.CoalescedClient._answer,
            Engines.answer,
        ],
        "HTTP (the gateway's app and routes)": _gateway_entries(),
    }
    table: dict[CodeType, str] = {}
    for stage, fns in entries.items():
        for fn in fns:
            if fn is not None and callable(fn):
                table[_code(fn)] = stage
    return table


def _gateway_entries() -> list[Any]:
    from starlette.applications import Starlette

    from coalesce._gateway import routes

    return [Starlette.__call__, routes.answer]


def _methods(cls: type) -> list[Any]:
    return [v for k, v in vars(cls).items() if callable(v) and not k.startswith("__")]


def _observer_methods() -> list[Any]:
    from coalesce._calls import Observers

    return [Observers.request_sent, Observers.request_done, Observers.group_done]


#: What issue 38 counted, per call: the code (or builtin) and its row's name.
COUNTED = {
    "regular expression searches": "search",
    "anyio cancel scopes entered": "CancelScope.__enter__",
    "current_async_library look-ups": "sniffio:current_async_library",
    "is_coroutine_callable checks": "is_coroutine_callable",
    "Random.seed calls": "Random.seed",
    "group runner runs": "run_group",
    "signature binds": "Signature._bind",
}


_SUSPENDABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


class StageHook:
    """``sys.setprofile`` hook: the CPU between two events goes to the stage on top of
    a stack that follows the frames (a coroutine resumed re-enters its whole chain)."""

    def __init__(self, entries: dict[CodeType, str], batching: str) -> None:
        self.entries = entries
        self.batching = batching  # the batcher's folder: its code is the batch stage
        self.spent: Counter[str] = Counter()
        self.counted: Counter[str] = Counter()
        self.stack: list[str] = ["the rest (event loop, tasks)"]
        self.last = 0
        self._names = {name.rsplit(".", 1)[-1].split(":")[-1]: name for name in COUNTED.values()}
        self._rows = {name: row for row, name in COUNTED.items()}
        self._stages: dict[CodeType, str | None] = {}
        self._frames: set[Any] = set()  # coroutine frames seen: a later event resumes one

    def _started(self, frame: Any) -> bool:
        """Whether a ``call`` event starts a function (not resumes a coroutine)."""
        if not frame.f_code.co_flags & _SUSPENDABLE:
            return True
        if frame in self._frames:
            return False
        self._frames.add(frame)
        return True

    def _stage(self, code: CodeType) -> str | None:
        try:
            return self._stages[code]
        except KeyError:
            stage = self.entries.get(code)
            if stage is None and code.co_filename.startswith(self.batching):
                stage = "batch"
            self._stages[code] = stage
            return stage

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        now = time.perf_counter_ns()
        stack = self.stack
        self.spent[stack[-1]] += now - self.last
        if event == "call":
            code = frame.f_code
            name = self._names.get(code.co_name)
            if name is not None and _counted(code, name) and self._started(frame):
                self.counted[self._rows[name]] += 1
            stack.append(self._stage(code) or stack[-1])
        elif event == "return":
            if len(stack) > 1:
                stack.pop()
        elif event == "c_call" and getattr(arg, "__name__", "") == "search" and _is_regex(arg):
            self.counted["regular expression searches"] += 1
        self.last = time.perf_counter_ns()


def _counted(code: CodeType, name: str) -> bool:
    """Whether ``code`` is the function ``name`` (``[package:]qualified.name``) names."""
    package, _, qualname = name.rpartition(":")
    own = getattr(code, "co_qualname", code.co_name)
    return own.endswith(qualname) and package in code.co_filename


def _is_regex(builtin: Any) -> bool:
    return type(getattr(builtin, "__self__", None)).__name__ == "Pattern"


@dataclass
class Stages:
    """Each stage's share of one row's CPU, and the counts per call."""

    shares: dict[str, float]
    counts: dict[str, float]


def profile_stages(make: Callable[[], Subject], calls: int, warm: int) -> Stages:
    """One run of ``calls`` concurrent calls under :class:`StageHook`."""
    import coalesce._batching as batching

    entries = stage_entries()
    folder = os.path.dirname(batching.__file__)

    async def run() -> StageHook:
        subject = make()
        for code in subject.fake:
            entries[code] = "the fakes (upstream, ASGI driver)"
        hook = StageHook(entries, folder)
        await asyncio.gather(*(subject.call(-1 - i) for i in range(warm)))
        gc.collect()
        hook.last = time.perf_counter_ns()
        sys.setprofile(hook)
        try:
            await asyncio.gather(*(subject.call(i) for i in range(calls)))
        finally:
            sys.setprofile(None)
        await subject.close()
        return hook

    hook = asyncio.run(run())
    total = sum(hook.spent.values()) or 1
    shares = {stage: hook.spent.get(stage, 0) / total for stage in STAGES}
    counts = {row: hook.counted.get(row, 0) / calls for row in COUNTED}
    return Stages(shares, counts)


# -- the gateway's coalesced path ----------------------------------------------------------


@dataclass
class GatewayRun:
    offered: float
    seconds: float
    calls: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    cpu: float = 0.0
    wall: float = 0.0
    lag: float = 0.0  # the driver's worst lateness, seconds
    group: float = float("nan")  # calls per coalesced request (the gateway's groups)
    upstream: float = float("nan")  # items per upstream request, the shadow calls too
    latencies: list[float] = field(default_factory=list)
    core: int | None = None

    @property
    def rate(self) -> float:
        """Calls answered right per second, from the first sent to the last answered."""
        return self.ok / self.wall if self.wall else float("nan")

    @property
    def sustained(self) -> bool:
        """Every call answered right, at the rate offered (the last answered within a
        second of the last sent), the CPU not saturated, the groups large enough."""
        answered = self.ok == self.calls and not self.errors
        kept = self.wall <= self.seconds + 1.0 and self.lag < 0.25
        return answered and kept and self.cpu < self.wall and self.group >= GATEWAY_MIN_GROUP


def _in_process_openai(upstream: Upstream) -> type:
    class InProcess(openai.AsyncOpenAI):  # type: ignore[misc]
        def __init__(self, **kwargs: Any) -> None:
            if kwargs.get("http_client") is None:
                transport = httpx2.MockTransport(upstream.http)
                kwargs["http_client"] = httpx2.AsyncClient(transport=transport)
            super().__init__(**kwargs)

    return InProcess


async def _asgi_call(app: Any, body: bytes) -> tuple[int, bytes]:
    """One ``POST /v1/chat/completions`` through the app, as a server would make it."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"gateway.test"),
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer sk-caller"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("gateway.test", 80),
        "state": {},
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def gateway_app(upstream: Upstream) -> tuple[Any, Any]:
    """``coalesce serve``'s app at its defaults and its state, started as its lifespan
    starts it, its upstream client on ``upstream``'s in-process transport (call in the
    loop that serves it)."""
    from coalesce._gateway.app import create_app, gateway_of
    from coalesce._gateway.config import load_config
    from coalesce._gateway.upstream import Upstreams, warm_up

    config = load_config(["--openai-upstream", "http://upstream.test/v1"], environ={})
    app = create_app(config)
    state = gateway_of(app)
    warm_up()
    with mock.patch.object(openai, "AsyncOpenAI", _in_process_openai(upstream)):
        state.upstreams = Upstreams.open(config, state.metrics)
    return app, state


def gateway_subject(size: int = 0) -> Subject:
    """Calls through the gateway's app, all at once (for its stages)."""
    upstream = Upstream()
    app, state = gateway_app(upstream)

    async def call(i: int) -> tuple[int, bytes]:
        body = json.dumps({"model": MODEL, "messages": messages(review(i))}).encode()
        return await _asgi_call(app, body)

    def right(out: tuple[int, bytes]) -> bool:
        status, reply = out
        return status == 200 and json.loads(reply)["choices"][0]["message"]["content"] == ANSWER

    async def close() -> None:
        await state.upstreams.aclose()

    codes = (Upstream.http.__code__, reply_text.__code__, _asgi_call.__code__)
    return Subject(call, close, right, upstream, codes)


async def _gateway_load(rate: float, seconds: float, warm: float) -> GatewayRun:
    upstream = Upstream()
    app, state = gateway_app(upstream)
    run = GatewayRun(rate, seconds)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, measured: bool) -> None:
        body = json.dumps({"model": MODEL, "messages": messages(review(i))}).encode()
        start = loop.time()
        try:
            status, reply = await _asgi_call(app, body)
        except Exception as exc:
            run.errors[type(exc).__name__] += measured
            return
        if not measured:
            return
        run.latencies.append(loop.time() - start)
        if status != 200:
            run.errors[f"HTTP {status}"] += 1
        elif json.loads(reply)["choices"][0]["message"]["content"] != ANSWER:
            run.errors["wrong answer"] += 1
        else:
            run.ok += 1

    async def drive(count: int, measured: bool, offset: int) -> float:
        start = loop.time()
        lag = 0.0
        for i in range(count):
            due = start + i / rate
            wait = due - loop.time()
            if wait > 0.001:
                await asyncio.sleep(wait)
            lag = max(lag, loop.time() - due)
            task = loop.create_task(one(offset + i, measured))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        return lag

    await drive(int(rate * warm), False, -10_000_000)
    while tasks:
        await asyncio.sleep(0.01)
    assert state.upstreams is not None
    wrapped = state.upstreams.openai.client
    before = _coalesced(wrapped)
    upstream.requests = upstream.items = 0
    gc.collect()
    run.calls = int(rate * seconds)
    cpu, wall = time.process_time(), time.perf_counter()
    run.lag = await drive(run.calls, True, 0)
    while tasks:
        await asyncio.sleep(0.001)
    run.cpu, run.wall = time.process_time() - cpu, time.perf_counter() - wall
    requests, items = (now - then for now, then in zip(_coalesced(wrapped), before, strict=True))
    run.group = items / requests if requests else float("nan")
    run.upstream = upstream.group
    await state.upstreams.aclose()
    return run


def _coalesced(wrapped: Any) -> tuple[float, float]:
    """The requests the wrapped client's statistics count so far (the shadow calls
    left out), and the items they carried."""
    requests = items = 0.0
    for snapshot in wrapped.statistics().values():
        requests += snapshot.requests
        items += snapshot.requests * snapshot.items_per_request if snapshot.requests else 0
    return requests, items


@contextlib.contextmanager
def one_core(pin: bool) -> Iterator[int | None]:
    """This process on one core (the last one it may use), then as it was."""
    if not pin or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    core = max(before)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, before)


def gateway(rate: float, seconds: float, warm: float, pin: bool) -> GatewayRun:
    with one_core(pin) as core:
        run = asyncio.run(_gateway_load(rate, seconds, warm))
    run.core = core
    return run


# -- the report -------------------------------------------------------------------------


@dataclass
class Report:
    prompt: dict[int, Measured] = field(default_factory=dict)
    wrap: dict[int, Measured] = field(default_factory=dict)
    sdk: Measured | None = None
    batch: dict[int, Measured] = field(default_factory=dict)
    loader: dict[int, Measured] = field(default_factory=dict)
    stages: dict[str, Stages] = field(default_factory=dict)
    gateway: GatewayRun | None = None


def _us(value: float) -> str:
    return "n/a" if value != value else f"{value:,.0f} µs"


def _ratio(a: float, b: float) -> str:
    return "n/a" if not (a == a and b == b and b) else f"{a / b:.2f}x"


def _size(size: int) -> str:
    return "alone (max_items=1)" if size == 1 else f"groups of {size}"


def print_cpu(report: Report, calls: int, rounds: int) -> None:
    sdk = report.sdk.us if report.sdk is not None else float("nan")
    print(f"\n## CPU per call ({calls:,} concurrent calls, median of {rounds} runs)\n")
    print("| case | `prompt` | of which GC | `wrap` | of which GC | wrap / prompt"
          " | upstream items per request | the SDK's own call, unwrapped | prompt / SDK"
          " | wrap / SDK |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in SIZES:
        p, w = report.prompt.get(size), report.wrap.get(size)
        pu, pg = (p.us, p.gc_us) if p else (float("nan"), float("nan"))
        wu, wg = (w.us, w.gc_us) if w else (float("nan"), float("nan"))
        group = p.group if p else (w.group if w else float("nan"))
        print(
            f"| {_size(size)} | {_us(pu)} | {_us(pg)} | {_us(wu)} | {_us(wg)} | {_ratio(wu, pu)}"
            f" | {group:.1f} | {_us(sdk)} | {_ratio(pu, sdk)} | {_ratio(wu, sdk)} |"
        )
    wrong = sum(m.wrong for m in (*report.prompt.values(), *report.wrap.values()))
    if wrong:
        print(f"\n**{wrong} wrong answers.**")


def print_batching(report: Report) -> None:
    if not report.batch:
        return
    print("\n## The batching layer alone (a batch function that does nothing)\n")
    print("| case | `@coalesce.batch` | aiodataloader 0.4.3 | coalesce / aiodataloader |")
    print("|---|---:|---:|---:|")
    for size in SIZES:
        b, d = report.batch.get(size), report.loader.get(size)
        bu, du = (b.us if b else float("nan")), (d.us if d else float("nan"))
        print(f"| {_size(size)} | {_us(bu)} | {_us(du)} | {_ratio(bu, du)} |")


def print_stages(report: Report) -> None:
    if not report.stages:
        return
    names = list(report.stages)
    totals = {}
    for name in names:
        kind, size = name.split(" ", 1)
        if kind == "gateway":
            run = report.gateway
            totals[name] = run.cpu / max(run.calls, 1) * 1e6 if run else float("nan")
            continue
        table = report.prompt if kind == "prompt" else report.wrap
        measured = table.get(int(size))
        totals[name] = measured.us if measured else float("nan")
    print("\n## CPU per call by stage (µs: each stage's share of the profiled run,")
    print("## times the CPU per call measured without the profile)\n")
    print("| stage | " + " | ".join(_column(name) for name in names) + " |")
    print("|---|" + "---:|" * len(names))
    for stage in STAGES:
        cells = [report.stages[n].shares[stage] * totals[n] for n in names]
        if any(cell >= 0.5 for cell in cells):
            print(f"| {stage} | " + " | ".join(f"{cell:,.0f}" for cell in cells) + " |")
    print("| **total** | " + " | ".join(f"**{totals[n]:,.0f}**" for n in names) + " |")
    print("\n## Per call, counted in the profiled run\n")
    print("| what | " + " | ".join(_column(name) for name in names) + " |")
    print("|---|" + "---:|" * len(names))
    for row in COUNTED:
        cells = [report.stages[n].counts[row] for n in names]
        print(f"| {row} | " + " | ".join(f"{cell:.2f}" for cell in cells) + " |")


def _column(name: str) -> str:
    kind, size = name.split(" ", 1)
    if kind == "gateway":
        return f"gateway at {GATEWAY_RATE:,.0f}/s"
    return f"{kind}, {_size(int(size)).split(' (')[0]}"


def print_gateway(run: GatewayRun | None) -> None:
    if run is None:
        return
    lat = sorted(run.latencies) or [float("nan")]
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    core = f"pinned to core {run.core}" if run.core is not None else "not pinned"
    print(f"\n## The gateway's coalesced path ({run.offered:,.0f} calls/s offered for"
          f" {run.seconds:g} s, one process {core})\n")  # fmt: skip
    print("| calls | answered right | errors | rate kept | CPU per call | CPU busy"
          " | calls per coalesced request | items per upstream request (shadow calls too)"
          " | p50 | p99 | driver's worst lag |")  # fmt: skip
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    errors = ", ".join(f"{k}: {n}" for k, n in run.errors.items()) or "none"
    print(
        f"| {run.calls:,} | {run.ok:,} | {errors} | {run.rate:,.0f}/s"
        f" | {_us(run.cpu / max(run.calls, 1) * 1e6)} | {run.cpu / run.wall:.0%}"
        f" | {run.group:.1f} | {run.upstream:.1f} | {p50 * 1e3:.1f} ms | {p99 * 1e3:.1f} ms"
        f" | {run.lag * 1e3:.1f} ms |"
    )


def print_targets(report: Report) -> None:
    print("\n## Targets\n")
    for size, limit in TARGETS.items():
        measured = report.prompt.get(size)
        if measured is not None:
            held = "HOLDS" if measured.us <= limit else "MISSED"
            print(f"- prompt, {_size(size)}: at most {limit:g} µs per call: {held}"
                  f" ({measured.us:,.0f} µs)")  # fmt: skip
    ratios = [
        report.wrap[s].us / report.prompt[s].us
        for s in SIZES
        if s in report.wrap and s in report.prompt
    ]
    if ratios:
        held = "HOLDS" if max(ratios) <= WRAP_RATIO_TARGET else "MISSED"
        print(f"- wrap within {WRAP_RATIO_TARGET:g}x of prompt: {held}"
              f" (at most {max(ratios):.2f}x)")  # fmt: skip
    run = report.gateway
    if run is not None:
        held = "HOLDS" if run.sustained else "MISSED"
        print(f"- the gateway's coalesced path at {run.offered:,.0f} calls/s on one core, no"
              f" error, groups of at least {GATEWAY_MIN_GROUP:g}: {held}"
              f" ({run.rate:,.0f}/s kept, CPU {run.cpu / run.wall:.0%} busy,"
              f" {sum(run.errors.values())} errors, {run.group:.1f} per request)")  # fmt: skip


# -- main ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    calls: int
    rounds: int
    profiled: int
    seconds: float
    warm_seconds: float
    sections: frozenset[str]
    pin: bool


def plan_of(args: argparse.Namespace) -> Plan:
    sections = frozenset(args.only.split(",")) if args.only else SECTIONS
    if args.smoke:
        return Plan(60, 1, 40, 0.2, 0.1, sections, pin=False)
    if args.quick:
        return Plan(args.calls or 4_000, args.rounds or 2, 2_000, 2.0, 0.5, sections, True)
    return Plan(args.calls or 20_000, args.rounds or 3, 4_000, 5.0, 1.0, sections, True)


SECTIONS = frozenset({"prompt", "wrap", "gateway", "batching"})


def run(plan: Plan) -> Report:
    report = Report()
    warm = 200 if plan.calls >= 1000 else 10

    def row(name: str, make: Callable[[], Subject]) -> Measured:
        log(f"{name}...")
        return measure(make, plan.calls, plan.rounds, warm)

    for size in SIZES:
        if "prompt" in plan.sections:
            report.prompt[size] = row(f"prompt, {_size(size)}", lambda s=size: prompt_subject(s))
            log(f"  {report.prompt[size].us:,.0f} µs per call")
        if "wrap" in plan.sections:
            report.wrap[size] = row(f"wrap, {_size(size)}", lambda s=size: wrap_subject(s))
            log(f"  {report.wrap[size].us:,.0f} µs per call")
        if "batching" in plan.sections:
            report.batch[size] = row(
                f"coalesce.batch, {_size(size)}", lambda s=size: batch_subject(s)
            )
            report.loader[size] = row(f"aiodataloader, {_size(size)}", lambda s=size: dataloader_subject(s))  # fmt: skip
    if "wrap" in plan.sections:
        report.sdk = row("the SDK alone", sdk_subject)
    for kind, make in (("prompt", prompt_subject), ("wrap", wrap_subject)):
        if kind not in plan.sections:
            continue
        for size in SIZES:
            log(f"{kind}, {_size(size)}, by stage...")
            report.stages[f"{kind} {size}"] = profile_stages(
                functools.partial(make, size), plan.profiled, warm
            )
    if "gateway" in plan.sections:
        log("the gateway, by stage...")
        report.stages["gateway 0"] = profile_stages(gateway_subject, plan.profiled, warm)
    if "gateway" in plan.sections:
        log(f"the gateway at {GATEWAY_RATE:,.0f} calls/s...")
        report.gateway = gateway(GATEWAY_RATE, plan.seconds, plan.warm_seconds, plan.pin)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4,000 calls, 2 rounds")
    parser.add_argument("--smoke", action="store_true", help="a few calls: it runs and prints")
    parser.add_argument("--calls", type=int, default=0, help="concurrent calls per run")
    parser.add_argument("--rounds", type=int, default=0, help="runs per row (the median)")
    parser.add_argument("--only", default="", help="prompt,wrap,gateway,batching")
    args = parser.parse_args(argv)
    plan = plan_of(args)
    with (
        tempfile.TemporaryDirectory() as store,
        mock.patch.dict(os.environ, {"COALESCE_STORE": os.path.join(store, "jobs.sqlite3")}),
    ):
        report = run(plan)
    print(f"# coalesce's own CPU per call (Python {sys.version.split()[0]}, {sys.platform})")
    print_cpu(report, plan.calls, plan.rounds)
    print_stages(report)
    print_batching(report)
    print_gateway(report.gateway)
    print_targets(report)


if __name__ == "__main__":
    main()

"""Every decision visible: the ``coalesce`` logger's DEBUG lines, the ids and attempts
events carry, and the live ``repr`` of a prompt function and of its engine.

Simulated provider in process, on virtual time (asyncio and trio).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
from collections.abc import Callable
from typing import Any, Literal

import anyio
import pydantic
import pytest
from pydantic import BaseModel

import coalesce
from coalesce import CallEvent, DispatchEvent, Event, RequestEvent, RetryEvent
from coalesce._engine.engine import Engine
from coalesce._engine.spec import FunctionSpec, Options
from coalesce._observe import recorder as prompt_stats
from coalesce._observe.events import RequestLabel, option_changes
from coalesce._observe.recorder import PromptRecorder
from coalesce.providers import CallableProvider, CompletionRequest, Usage
from coalesce.providers._client import as_provider
from coalesce.testing import FaultPlan, SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    # Token counts for gpt-4o-mini fall back to the bundled cl100k_base offline.
    pytest.mark.filterwarnings("ignore::coalesce.CoalesceWarning"),
]

NUMBER = r"\d+\.\d\d"
TOKENS = r"[\d,]+"
DOLLARS = r"\$\d+\.\d{6}"


class Tag(BaseModel):
    label: Literal["billing", "bug", "other"]


#: Instructions long enough that packing pays for itself: groups are packed requests.
LONG = "Tag the support ticket: billing, bug or other. " + " ".join(
    f"Rule {n}: a ticket that mentions invoices, refunds or charges is billing." for n in range(40)
)


#: The qualified name of the function :func:`tagger` decorates.
NAME = "tagger.<locals>.tag"


def tagger(client: Any, **options: Any) -> coalesce.PromptFunction[..., Tag]:
    options.setdefault("instructions", LONG)

    @coalesce.prompt(client=client, model="gpt-4o-mini", **options)
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket: billing, bug or other."""

    return tag


async def burst(fn: Callable[[str], Any], calls: int, gap: float = 0.0) -> None:
    async with anyio.create_task_group() as tg:
        for n in range(calls):
            tg.start_soon(fn, f"ticket {n}: I was charged twice this month")
            if gap:
                await anyio.sleep(gap)


def lines(caplog: pytest.LogCaptureFixture, pattern: str) -> list[re.Match[str]]:
    """The DEBUG lines of the ``coalesce`` logger matching ``pattern`` entirely."""
    found = []
    for record in caplog.records:
        if record.name == "coalesce" and record.levelno == logging.DEBUG:
            match = re.fullmatch(pattern, record.getMessage())
            if match is not None:
                found.append(match)
    return found


def engine_for(client: Any, **options: Any) -> Engine:
    adapter: pydantic.TypeAdapter[Tag] = pydantic.TypeAdapter(Tag)
    spec = FunctionSpec(
        name="tag",
        provider=as_provider(client),
        model="gpt-4o-mini",
        instructions=LONG,
        output_schema=adapter.json_schema(),
        validate=adapter.validate_python,
    )
    return Engine(spec, Options(**options))


# --- the DEBUG lines ----------------------------------------------------------------


async def test_each_group_and_each_request_is_one_debug_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="coalesce")
    sim = SimulatedProvider()
    tag = tagger(sim.openai_client(max_retries=0), latency_budget=2.0, max_items=20)
    await burst(tag, 30, gap=0.01)
    name = re.escape(NAME)

    groups = lines(
        caplog,
        rf"{name}: group (\d+) dispatched \((\w+)\): (\d+) calls?, predicted ({NUMBER}) s,"
        rf" ({NUMBER}) s left of the tightest budget",
    )
    numbers = [int(m[1]) for m in groups]
    assert numbers == list(range(1, len(groups) + 1))
    sizes = {int(m[1]): int(m[3]) for m in groups}
    assert sum(sizes.values()) == 30
    reasons = {str(reason) for reason in coalesce.DispatchReason}
    assert {m[2] for m in groups} <= reasons
    assert all(0 < float(m[5]) <= 2.0 for m in groups)

    requests = lines(
        caplog,
        rf"{name}: request (chatcmpl-sim\d+) \(group (\d+), attempt 1(?:, plain)?\): (\d+) items?"
        rf" in ({NUMBER}) s \(predicted ({NUMBER}) s\); ({TOKENS}) prompt tokens"
        rf" \(plain calls ~({TOKENS})\), ({TOKENS}) output; ({DOLLARS}) \(plain calls ~({DOLLARS})\)",
    )
    stats = tag.statistics()
    assert len(requests) == stats.requests
    assert len({m[1] for m in requests}) == len(requests)  # one id per request
    items: dict[int, int] = {}
    for m in requests:
        items[int(m[2])] = items.get(int(m[2]), 0) + int(m[3])
    assert items == sizes  # every call of every group went in a request of that group
    tokens = sum(int(m[6].replace(",", "")) for m in requests)
    assert tokens == stats.input_tokens
    assert sum(int(m[7].replace(",", "")) for m in requests) == stats.input_tokens_one_per_item

    calls = lines(caplog, rf"{name}: call answered in {NUMBER} s \(budget 2\.00 s(, missed)?\),.*")
    assert len(calls) == 30
    assert sum(m[1] is not None for m in calls) == stats.budget_misses


async def test_a_retry_and_a_reask_name_their_group_and_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="coalesce")
    events: list[Event] = []
    sim = SimulatedProvider(faults=FaultPlan(script=["rate_limit", "missing_item"]))
    client = sim.openai_client(max_retries=0)
    tag = tagger(client, max_items=4, max_wait=0.05, on_event=events.append)
    await burst(tag, 4)  # one group of 4
    name = re.escape(NAME)

    (retry,) = lines(caplog, rf"{name}: a request failed \(attempt 1: RateLimitError: .*\);.*")
    assert re.search(rf"sending it again in {NUMBER} s$", retry[0])
    assert next(e for e in events if isinstance(e, RetryEvent)).attempt == 1
    (dispatch,) = [e for e in events if isinstance(e, DispatchEvent)]
    assert (dispatch.group, dispatch.items, dispatch.predicted) == (1, 4, None)  # no budget
    first, again = [e for e in events if isinstance(e, RequestEvent)]
    assert (first.group, first.attempt, first.reask, first.items) == (1, 1, False, 4)
    assert (again.group, again.attempt, again.reask, again.items) == (1, 2, True, 1)
    assert first.request_id.startswith("chatcmpl-sim")
    assert again.request_id.startswith("chatcmpl-sim")
    assert first.request_id != again.request_id
    assert first.predicted is None
    assert again.predicted is None
    assert lines(
        caplog,
        rf"{name}: request {again.request_id} \(group 1, attempt 2, re-ask(, plain)?\):"
        rf" 1 item in {NUMBER} s; .* prompt tokens, .* output; {DOLLARS}",
    )


async def test_a_failed_request_without_a_reply_id_is_named_by_its_number(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="coalesce")

    async def broken(request: CompletionRequest) -> str:
        await anyio.sleep(0.25)
        raise ValueError("the model is on fire")

    events: list[Event] = []
    tag = tagger(CallableProvider(broken), max_wait=0.05, on_event=events.append)
    await burst(lambda ticket: _ignore(tag(ticket)), 2)
    name = re.escape(NAME)

    requests = [e for e in events if isinstance(e, RequestEvent)]
    assert {e.request_id for e in requests} == {f"#{n}" for n in range(1, len(requests) + 1)}
    assert all(isinstance(e.error, ValueError) and e.attempt == 1 for e in requests)
    failed = lines(
        caplog,
        rf"{name}: request (#\d) \(group 1, attempt 1(?:, plain)?\): (\d) items? failed after"
        r" 0\.25 s: ValueError: the model is on fire",
    )
    assert sorted(m[1] for m in failed) == sorted(e.request_id for e in requests)
    assert sum(int(m[2]) for m in failed) == 2
    assert len(lines(caplog, rf"{name}: call failed in 0\.30 s, waited 0\.05 s for company.*")) == 2


async def _ignore(call: Any) -> None:
    with contextlib.suppress(ValueError):
        await call


async def test_an_unmeetable_budget_says_so_and_goes_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="coalesce")
    sim = SimulatedProvider()
    tag = tagger(sim.openai_client(max_retries=0), latency_budget=0.1)
    with pytest.raises(coalesce.RequestTimeoutError):
        await tag("ticket 1: the app crashes")
    name = re.escape(NAME)
    (unmeetable,) = lines(
        caplog,
        rf"{name}: a call's budget \(0\.10 s\) is shorter than the predicted ({NUMBER}) s of"
        r" asking for it alone; sent alone, at once \(counted in unmeetable_budgets\)",
    )
    assert float(unmeetable[1]) > 0.1
    assert lines(caplog, rf"{name}: group 1 dispatched \(solo\): 1 call, predicted {NUMBER} s,.*")
    assert tag.statistics().unmeetable_budgets == 1


async def test_nothing_is_logged_or_built_when_nobody_listens(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an event was built with nobody listening")

    for event in ("CallEvent", "DispatchEvent", "RequestEvent", "RetryEvent", "UnmeetableEvent"):
        monkeypatch.setattr(prompt_stats, event, forbidden)
    caplog.set_level(logging.INFO, logger="coalesce")
    sim = SimulatedProvider(faults=FaultPlan(script=["rate_limit"]))
    tag = tagger(sim.openai_client(max_retries=0), latency_budget=2.0)
    await burst(tag, 5, gap=0.01)
    assert tag.statistics().calls == 5
    assert not [r for r in caplog.records if r.name == "coalesce"]
    caplog.set_level(logging.DEBUG, logger="coalesce")  # watched, a recorder does build
    recorder = PromptRecorder("tag", "m", telemetry=False)
    with pytest.raises(AssertionError, match="nobody listening"):
        recorder.call_finished(1.0, ok=True)


def test_a_request_line_says_what_is_known() -> None:
    usage = Usage(1200, 80, cached_input_tokens=1024)
    label = RequestLabel("msg_01", group=3, attempt=1, predicted=1.5)
    priced = RequestEvent("f", "m", 4, usage, 0.2, 1.25, 0.0004, 0.001, False, None, *label)
    assert str(priced) == (
        "f: request msg_01 (group 3, attempt 1): 4 items in 1.25 s (predicted 1.50 s);"
        " 1,200 prompt tokens (1,024 cached), 80 output; $0.000400"
    )
    compared = dataclasses.replace(priced, input_tokens_one_per_item=2000)
    assert "1,200 prompt tokens (1,024 cached) (plain calls ~2,000)" in str(compared)
    assert str(compared).endswith("$0.000400 (plain calls ~$0.001000)")
    reask = dataclasses.replace(compared, reask=True, attempt=2, plain=True, predicted=None)
    assert str(reask).startswith("f: request msg_01 (group 3, attempt 2, re-ask, plain): 4 items")
    assert "plain calls" not in str(reask)  # a re-ask is not compared with plain calls
    unpriced = RequestEvent("f", "m", 1, Usage(10, 2), None, 0.5, math.nan, math.nan)
    assert str(unpriced) == "f: request ? (no group): 1 item in 0.50 s; 10 prompt tokens, 2 output"
    silent = RequestEvent("f", "m", 2, None, None, None, math.nan, math.nan, request_id="#4")
    assert str(silent) == "f: request #4 (no group): 2 items; no usage reported"
    long_error = RuntimeError("x" * 500)
    failed = dataclasses.replace(silent, error=long_error, seconds=2.0)
    assert (
        str(failed)
        == f"f: request #4 (no group): 2 items failed after 2.00 s: RuntimeError: {'x' * 197}..."
    )


# --- ids and attempts on events and calls ---------------------------------------------


async def test_each_call_learns_the_requests_that_carried_it() -> None:
    events: list[Event] = []
    sim = SimulatedProvider(faults=FaultPlan(script=["missing_item"]))
    engine = engine_for(sim.openai_client(max_retries=0), max_wait=0.05, on_event=events.append)
    jobs = [engine.new_job(f"ticket {n}") for n in range(3)]
    async with anyio.create_task_group() as tg:
        for job in jobs:
            tg.start_soon(engine.answer, job)
    calls = [e for e in events if isinstance(e, CallEvent)]
    sent = {e.request_id: e for e in events if isinstance(e, RequestEvent)}
    assert len(calls) == 3
    for call in calls:
        assert len(call.requests) == call.attempts >= 1
        assert all(re.fullmatch(r"chatcmpl-sim\d+", request) for request in call.requests)
        assert all(sent[request].group >= 1 for request in call.requests)  # the reply ids
    assert sorted(call.attempts for call in calls) == [1, 1, 2]  # one was asked again
    assert sorted(job.attempts for job in jobs) == [1, 1, 2]
    stats = engine.statistics()
    assert len({r for call in calls for r in call.requests}) == stats.requests
    # The listeners' tables forget each call once its caller has finished.
    assert all(engine.parts.statistics.requests_of(job) == [] for job in jobs)
    assert all(engine.parts.dispatch.of(job) is None for job in jobs)


def test_a_call_event_names_its_requests_and_attempts() -> None:
    events: list[Event] = []
    rec = PromptRecorder("tag", "m", on_event=events.append, telemetry=False)
    rec.call_finished(
        1.5, wait=0.05, budget=1.0, ok=True, requests=("#3", "chatcmpl-x"), attempts=2
    )
    rec.call_finished(0.2, ok=False)
    answered, failed = events
    assert isinstance(answered, CallEvent)
    assert isinstance(failed, CallEvent)
    assert (answered.requests, answered.request_id, answered.attempts) == (
        ("#3", "chatcmpl-x"),
        "chatcmpl-x",
        2,
    )
    assert str(answered) == (
        "tag: call answered in 1.50 s (budget 1.00 s, missed), waited 0.05 s for company;"
        " requests #3, chatcmpl-x, 2 attempts"
    )
    assert (failed.requests, failed.request_id, failed.attempts) == ((), "", 0)
    assert str(failed) == "tag: call failed in 0.20 s"


async def test_call_events_name_the_requests_that_answered_them() -> None:
    events: list[Event] = []
    sim = SimulatedProvider()
    tag = tagger(sim.openai_client(max_retries=0), on_event=events.append)
    await burst(tag, 3)
    calls = [e for e in events if isinstance(e, CallEvent)]
    answered_by = {e.request_id for e in events if isinstance(e, RequestEvent)}
    assert len(calls) == 3
    assert all(e.attempts == 1 and e.request_id in answered_by for e in calls)


# --- the live repr ----------------------------------------------------------------


async def test_the_repr_shows_options_progress_and_the_planners_limits() -> None:
    sim = SimulatedProvider()
    engine = engine_for(sim.openai_client(max_retries=0), latency_budget=2.0, max_items=20)
    assert engine.planning is not None
    limit = engine.planning.limits.max_items
    head = "<coalesce.Engine tag model='gpt-4o-mini' budget=2s max_items=20:"
    tail = f"groups up to {limit}, answers held>"
    assert repr(engine) == f"{head} 0 calls, 0 requests, {tail}"
    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(engine.submit, f"ticket {n}")
        await anyio.sleep(0.01)
        assert repr(engine) == f"{head} 0 calls (3 waiting), 0 requests, {tail}"
        await anyio.sleep(0.5)  # sent (the window: a quarter of the budget), not yet answered
        sent = engine.statistics().requests
        assert sent >= 1
        in_flight = f"{sent} request{'s' if sent > 1 else ''} ({sent} in flight)"
        per_request = f"{3 / sent:.1f} items/request"
        assert repr(engine) == f"{head} 0 calls, {in_flight}, {per_request}, {tail}"
    done = f"{sent} request{'s' if sent > 1 else ''}"
    assert repr(engine) == f"{head} 3 calls, {done}, {per_request}, {tail}"


async def test_a_prompt_functions_repr_is_its_engines() -> None:
    sim = SimulatedProvider()
    tag = tagger(sim.openai_client(max_retries=0), stream=False, max_wait=0.1)
    await tag("ticket 1: I cannot log in")
    text = repr(tag)
    name = NAME
    assert text == (
        f"<coalesce.prompt {name} model='gpt-4o-mini' max_wait=0.1s stream=False:"
        " 1 call, 1 request, 1.0 items/request, groups up to 4, answers held>"
    )


async def test_the_repr_says_when_answers_stream_early() -> None:
    sim = SimulatedProvider()
    early = tagger(sim.openai_client(max_retries=0), schema_enforced=True)
    assert repr(early).endswith(", answers stream early>")
    assert "schema_enforced=True" in repr(early)
    held = tagger(sim.openai_client(max_retries=0), schema_enforced=True, stream=False)
    assert repr(held).endswith(", answers held>")


def test_option_changes_lists_what_differs_from_the_defaults() -> None:
    assert option_changes(Options()) == ""
    options = Options(max_items=20, latency_budget=2.0, stream=False, max_wait=0.1, timeout=30)
    assert (
        option_changes(options) == " budget=2s max_wait=0.1s max_items=20 stream=False timeout=30s"
    )
    assert option_changes(Options(on_event=print)) == " on_event=print"
    # Given, even at the default's value, max_items pins the cap: it shows.
    assert option_changes(Options(max_items=4)) == " max_items=4"
    assert option_changes(object()) == ""

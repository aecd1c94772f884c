"""``@coalesce.prompt`` against the simulated provider, in process, on virtual time.

This module uses ``from __future__ import annotations`` on purpose: output models
defined at module level must still resolve.
"""

from __future__ import annotations

import enum
import json
import typing
from typing import Any, Literal

import anyio
import openai
import pytest
from pydantic import BaseModel, TypeAdapter

import coalesce
from coalesce import (
    ConfigurationError,
    InvalidOutputError,
    ItemError,
    TruncatedOutputError,
)
from coalesce.providers import CallableProvider, Completion, CompletionRequest
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


class Ticket(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: int
    summary: str


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


def expected(sim: SimulatedProvider, item: Any, output_type: Any) -> Any:
    adapter: TypeAdapter[Any] = TypeAdapter(output_type)
    return adapter.validate_python(sim.expected_output(item, adapter.json_schema()))


async def call_all(fn: Any, items: list[Any]) -> list[Any]:
    results: list[Any] = [None] * len(items)

    async def one(index: int, item: Any) -> None:
        try:
            results[index] = await fn(item)
        except Exception as exc:
            results[index] = exc

    async with anyio.create_task_group() as tg:
        for index, item in enumerate(items):
            tg.start_soon(one, index, item)
    # Callers are answered mid-stream; closing waits for the requests themselves to
    # end, so the simulator's log is complete when the test reads it.
    await fn.aclose()
    return results


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(time_scale=0.01)


def make_tagger(client: Any, **options: Any) -> Any:
    @coalesce.prompt(packing="always", client=client, model="gpt-4o-mini", **options)
    async def tag(ticket: str) -> Ticket:
        """Tag the support ticket with a category, an urgency from 1 to 5 and a summary."""

    return tag


async def test_each_caller_gets_the_answer_to_its_own_item(sim: SimulatedProvider) -> None:
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=20, max_wait=0.05)
    tickets = [f"ticket number {n}: my invoice is wrong" for n in range(300)]
    results = await call_all(tag, tickets)
    assert results == [expected(sim, t, Ticket) for t in tickets]
    stats = sim.statistics()
    assert stats.requests <= 2 * 15
    assert stats.items == 300


@pytest.mark.parametrize(
    ("output_type", "item"),
    [(str, "plain"), (int, "a number"), (Mood, "mood"), (list[str], "tags"), (bool, "yes?")],
)
async def test_output_types(sim: SimulatedProvider, output_type: Any, item: str) -> None:
    async def fn(text: str) -> Any:
        """Answer."""

    fn.__annotations__["return"] = output_type
    answer = coalesce.prompt(packing="always", client=sim.openai_client(max_retries=0), model="m")(
        fn
    )
    result = await answer(item)
    assert result == expected(sim, item, output_type)
    assert isinstance(result, typing.get_origin(output_type) or output_type)


async def test_several_parameters_make_an_object_item(sim: SimulatedProvider) -> None:
    @coalesce.prompt(packing="always", client=sim.openai_client(max_retries=0), model="m")
    async def review(title: str, stars: int, text: str = "none") -> Mood:
        """Guess the reviewer's mood."""

    assert await review("Dune", 5) == expected(
        sim, {"title": "Dune", "stars": 5, "text": "none"}, Mood
    )


async def test_a_body_that_returns_formats_its_own_item(sim: SimulatedProvider) -> None:
    @coalesce.prompt(packing="always", client=sim.openai_client(max_retries=0), model="m")
    async def review(title: str, stars: int) -> Mood:
        """Guess the reviewer's mood."""
        return f"{title} ({stars}/5)"

    assert await review("Dune", 5) == expected(sim, "Dune (5/5)", Mood)


async def test_missing_and_invalid_items_are_reasked_alone_neighbours_untouched(
    sim: SimulatedProvider,
) -> None:
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=8, max_wait=0.05)
    sim.inject("missing_item")
    tickets = [f"t{n}" for n in range(8)]
    results = await call_all(tag, tickets)
    assert results == [expected(sim, t, Ticket) for t in tickets]
    assert [r.items for r in sim.requests] == [8, 1]


async def test_an_item_that_keeps_failing_gets_its_own_error(sim: SimulatedProvider) -> None:
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=4, max_attempts=2)
    # The packed reply misses one item; asked again alone (a plain call), it is not JSON.
    sim.inject("missing_item", "malformed_json")
    results = await call_all(tag, ["a", "b", "c", "d"])
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1
    (error,) = errors
    assert isinstance(error, InvalidOutputError)
    assert error.attempts == 2
    assert "after 2 attempt" in str(error)
    assert [r.items for r in sim.requests] == [4, 1]
    assert [r.faults for r in sim.requests] == [("missing_item",), ("malformed_json",)]
    assert [r for r in results if not isinstance(r, Exception)] == [
        expected(sim, t, Ticket)
        for t, r in zip("abcd", results, strict=False)
        if not isinstance(r, Exception)
    ]


class Level(BaseModel):
    level: int


async def test_a_group_of_one_is_asked_as_a_plain_call() -> None:
    seen: list[CompletionRequest] = []

    async def answer(request: CompletionRequest) -> str:
        seen.append(request)
        if request.user.startswith("[{"):  # packed
            return json.dumps(
                {"results": {i["id"]: {"level": 2} for i in json.loads(request.user)}}
            )
        return 'Here it is: {"level": 1}'

    provider = CallableProvider(answer, structured=True)

    @coalesce.prompt(packing="always", client=provider, model="m", max_wait=0.0)
    async def grade(ticket: str) -> Level:
        """Grade the ticket."""

    @coalesce.prompt(packing="always", client=provider, model="m", max_wait=0.0)
    async def grade_model(ticket: Level) -> Level:
        """Grade the ticket."""

    @coalesce.prompt(packing="always", client=provider, model="m", max_wait=0.0)
    async def label(ticket: str) -> Literal["a", "b"]:
        """Label the ticket."""

    @coalesce.prompt(packing="always", client=provider, model="m", max_wait=0.0)
    async def summarise(ticket: str) -> str:
        """Summarise the ticket."""

    assert await grade("the app crashes") == Level(level=1)
    plain = seen[-1]
    assert plain.system == "Grade the ticket."  # no packing format
    assert plain.user == "the app crashes"  # a string as it is
    assert plain.reply_schema == {
        "properties": {"level": {"type": "integer"}},  # pydantic's "Level" title left out
        "required": ["level"],
        "title": "Level",
        "type": "object",
    }
    assert await grade_model(Level(level=7)) == Level(level=1)
    assert seen[-1].user == '{"level":7}'  # anything else as compact JSON
    # Text is asked for as text, and the reply is the answer.
    assert await summarise("long ticket") == 'Here it is: {"level": 1}'
    assert (seen[-1].system, seen[-1].reply_schema) == ("Summarise the ticket.", None)
    # An output that is not an object is asked for wrapped, as {"answer": ...}: this
    # provider answers {"level": 1}, which is no answer, so the call fails.
    with pytest.raises(ItemError):
        await label("x")
    assert seen[-1].user == "x"
    assert seen[-1].reply_schema["required"] == ["answer"]
    for fn in (grade, grade_model, label, summarise):
        await fn.aclose()


async def test_an_invalid_item_in_a_streamed_reply_is_asked_again() -> None:
    # Regression: an item found invalid while the reply streamed was dropped, and its
    # caller got None instead of a re-ask or an error.
    seen: list[CompletionRequest] = []

    async def answer(request: CompletionRequest) -> str:
        seen.append(request)
        if request.user.startswith("[{"):
            items = json.loads(request.user)
            first, second = (item["id"] for item in items)
            return json.dumps({"results": {first: {"level": 1}, second: {"level": "x"}}})
        return '{"level": 2}'

    @coalesce.prompt(
        packing="always", client=CallableProvider(answer, structured=True), model="m", max_wait=0.5
    )
    async def grade(ticket: str) -> Level:
        """Grade the ticket."""

    results = await call_all(grade, ["a", "bb"])  # "a", shorter, is written first
    assert results == [Level(level=1), Level(level=2)]
    assert [r.stream for r in seen] == [True, True]
    assert seen[1].user == "bb"  # the invalid one, asked again alone
    await grade.aclose()


async def test_a_plain_call_that_is_not_json_is_asked_again() -> None:
    replies = iter(["Sorry, I cannot.", "", '{"level": 3'])

    async def answer(request: CompletionRequest) -> Completion:
        text = next(replies)
        return Completion(text, "length" if text.endswith("3") else "stop")

    @coalesce.prompt(
        packing="always", client=CallableProvider(answer), model="m", max_wait=0.0, max_attempts=3
    )
    async def grade(ticket: str) -> Level:
        """Grade the ticket."""

    with pytest.raises(TruncatedOutputError) as caught:
        await grade("x")
    assert caught.value.attempts == 3
    await grade.aclose()


async def test_truncated_reply_keeps_complete_items_and_reasks_the_rest(
    sim: SimulatedProvider,
) -> None:
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=6)
    sim.inject("truncate")
    tickets = [f"t{n}" for n in range(6)]
    results = await call_all(tag, tickets)
    assert results == [expected(sim, t, Ticket) for t in tickets]
    first, *reasks = sim.requests
    assert first.items == 6
    assert 1 <= sum(r.items for r in reasks) < 6


@pytest.mark.parametrize(
    "fault", ["code_fence", "prose", "out_of_order", "duplicate_id", "extra_id", "malformed_json"]
)
async def test_bad_replies_never_give_a_caller_another_callers_answer(
    sim: SimulatedProvider, fault: str
) -> None:
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=5)
    sim.inject(fault)
    tickets = [f"t{n}" for n in range(5)]
    results = await call_all(tag, tickets)
    assert results == [expected(sim, t, Ticket) for t in tickets]


async def test_provider_errors_reach_every_caller_as_the_sdk_type(sim: SimulatedProvider) -> None:
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=3)
    sim.inject(*["server_error"] * 5)
    results = await call_all(tag, ["a", "b", "c"])
    assert all(isinstance(r, openai.InternalServerError) for r in results)
    assert len(sim.requests) == 5  # 1 + max_retries=4, none multiplied by the SDK's


async def test_retries_recover_from_transient_errors(sim: SimulatedProvider) -> None:
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=3)
    sim.inject("rate_limit", "unavailable")
    assert await call_all(tag, ["a", "b", "c"]) == [expected(sim, t, Ticket) for t in "abc"]


async def test_streaming_resolves_each_caller_before_the_reply_ends() -> None:
    sim = SimulatedProvider(time_scale=1.0, output_tokens=40)
    # Declared to enforce the reply schema: answers are handed over as they complete.
    tag = make_tagger(
        sim.openai_client(max_retries=0), max_items=4, max_wait=0.01, schema_enforced=True
    )
    finished: dict[str, float] = {}

    async def one(ticket: str) -> None:
        await tag(ticket)
        finished[ticket] = anyio.current_time()

    async with anyio.create_task_group() as tg:
        for ticket in ["a", "b", "c", "d"]:
            tg.start_soon(one, ticket)
    await tag.aclose()
    (request,) = sim.requests
    assert request.stream
    times = sorted(finished.values())
    assert times[0] < times[-1]  # resolved one by one as results completed
    assert times[0] < request.finished_at


async def test_without_streaming_everyone_waits_for_the_whole_reply() -> None:
    sim = SimulatedProvider(time_scale=1.0, output_tokens=40)
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=4, stream=False)
    finished: list[float] = []

    async def one(ticket: str) -> None:
        await tag(ticket)
        finished.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        for ticket in ["a", "b", "c", "d"]:
            tg.start_soon(one, ticket)
    assert len(set(finished)) == 1


async def test_partitions_never_share_a_prompt(sim: SimulatedProvider) -> None:
    @coalesce.prompt(
        packing="always",
        client=sim.openai_client(max_retries=0),
        model="m",
        partition=lambda text, tenant: tenant,
    )
    async def tag(text: str, tenant: str) -> Mood:
        """Mood."""

    async with anyio.create_task_group() as tg:
        for n in range(6):
            tg.start_soon(tag, f"text {n}", "acme" if n % 2 else "globex")
    await tag.aclose()  # callers are answered mid-stream; wait for the requests to end
    assert sorted(r.items for r in sim.requests) == [3, 3]


async def test_dedupe_shares_one_slot_between_identical_items(sim: SimulatedProvider) -> None:
    tag = make_tagger(sim.openai_client(max_retries=0), dedupe=True)
    results = await call_all(tag, ["same", "same", "other", "same"])
    assert results == [expected(sim, t, Ticket) for t in ["same", "same", "other", "same"]]
    assert [r.items for r in sim.requests] == [2]


async def test_anthropic_client(sim: SimulatedProvider) -> None:
    tag = make_tagger(sim.anthropic_client(max_retries=0), max_items=10)
    tickets = [f"t{n}" for n in range(25)]
    assert await call_all(tag, tickets) == [expected(sim, t, Ticket) for t in tickets]
    assert all(r.api == "anthropic.messages" for r in sim.requests)


async def test_plain_async_callable_as_client() -> None:
    sim = SimulatedProvider()
    seen: list[int] = []

    async def backend(request: Any) -> str:
        import json

        items = json.loads(request.user)
        seen.append(len(items))
        return json.dumps(
            {"results": [{"id": i["id"], "output": i["input"].upper()} for i in items]}
        )

    @coalesce.prompt(packing="always", client=backend, model="local")
    async def shout(text: str) -> str:
        """Shout it."""

    assert await call_all(shout, ["a", "b"]) == ["A", "B"]
    assert seen == [2]
    del sim


def test_configuration_errors() -> None:
    async def backend(request: Any) -> str:
        return ""

    with pytest.raises(ConfigurationError, match="needs client="):

        @coalesce.prompt(packing="always", client=None, model="m")
        async def a(x: str) -> str:
            """Doc."""

    with pytest.raises(ConfigurationError, match="no instructions"):

        @coalesce.prompt(packing="always", client=backend, model="m")
        async def b(x: str) -> str: ...

    with pytest.raises(ConfigurationError, match="async def"):

        @coalesce.prompt(packing="always", client=backend, model="m")  # type: ignore[arg-type]
        def c(x: str) -> str:
            """Doc."""
            return x

    with pytest.raises(ConfigurationError, match="max_items must be an integer >= 1"):

        @coalesce.prompt(packing="always", client=backend, model="m", max_items=0)
        async def d(x: str) -> str:
            """Doc."""

    with pytest.raises(ConfigurationError, match="client must be"):

        @coalesce.prompt(packing="always", client="https://example.invalid", model="m")
        async def e(x: str) -> str:
            """Doc."""


def test_item_errors_carry_the_raw_output() -> None:
    error = InvalidOutputError("bad", item_id="3", raw={"x": 1}, attempts=2)
    assert isinstance(error, ItemError)
    assert (error.item_id, error.raw, error.attempts) == ("3", {"x": 1}, 2)


async def test_statistics_count_calls_tokens_cost_and_savings(sim: SimulatedProvider) -> None:
    events: list[Any] = []
    tag = make_tagger(sim.openai_client(max_retries=0), max_items=10, on_event=events.append)
    sim.inject("rate_limit")
    await call_all(tag, [f"t{n}" for n in range(20)])
    stats = tag.statistics()
    assert isinstance(stats, coalesce.PromptStatistics)
    assert (stats.calls, stats.calls_failed) == (20, 0)
    assert stats.requests == sim.statistics().requests - 1  # the 429 was retried
    assert stats.retries == 1
    assert stats.items_per_request == 10
    assert stats.input_tokens == sum(r.prompt_tokens for r in sim.requests if r.status == 200)
    assert stats.input_tokens < stats.input_tokens_one_per_item
    assert 0 < stats.estimated_cost < stats.estimated_cost_one_per_item
    assert 0 < stats.savings < 1
    assert stats.latency_p50 > 0
    assert {type(event).__name__ for event in events} >= {"CallEvent", "RequestEvent"}


async def test_calls_sent_alone_cost_what_plain_calls_cost(sim: SimulatedProvider) -> None:
    @coalesce.prompt(
        packing="always", client=sim.openai_client(max_retries=0), model="gpt-4o-mini", max_wait=0.0
    )
    async def grade(ticket: str) -> Level:
        """Grade the support ticket by how urgent it is."""

    answers = [await grade(f"ticket {n}") for n in range(3)]  # one at a time: groups of one
    assert answers == [expected(sim, f"ticket {n}", Level) for n in range(3)]
    stats = grade.statistics()
    assert (stats.requests, stats.items_per_request) == (3, 1.0)
    assert stats.input_tokens == stats.input_tokens_one_per_item == sim.statistics().prompt_tokens
    assert stats.savings == 0.0
    await grade.aclose()

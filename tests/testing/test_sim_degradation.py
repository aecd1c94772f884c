"""The simulated provider's packing degradation: wrong answers by group size and position.

The pure parts (the chance, the verdicts, the wrong answers) run without an event loop;
the rest goes through the official SDKs in process on virtual time (both backends), and
once over real HTTP.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

import anyio
import httpx2
import pytest
from pydantic import BaseModel, Field, TypeAdapter

import coalesce
from coalesce._exceptions import ConfigurationError
from coalesce._wire.packing import pack_request
from coalesce.providers._shapes import anthropic_tool, openai_response_format
from coalesce.testing import (
    PackingDegradation,
    SimulatedProvider,
    degraded_output,
    expected_output,
)
from coalesce.testing._cli import _provider as cli_provider
from coalesce.testing._cli import build_parser

MODEL = "gpt-4o-mini"
Label = Literal["positive", "negative"]
LABEL_SCHEMA = TypeAdapter(Label).json_schema()

# The openai SDK stops reading its SSE generators at [DONE] without closing them;
# trio warns when such a generator is collected. Nothing the simulator can change.
SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)


class Ticket(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: int = Field(ge=1, le=5)
    summary: str
    urgent: bool


TICKET_SCHEMA = Ticket.model_json_schema()


def plausible(count: int, chances: list[float], sigmas: float = 4.0) -> bool:
    """Whether ``count`` successes are within ``sigmas`` standard deviations of the
    mean of independent draws with these chances (a binomial's normal approximation)."""
    mean = sum(chances)
    spread = math.sqrt(sum(p * (1 - p) for p in chances))
    return abs(count - mean) <= sigmas * spread


# -- the chance and the verdicts: pure ---------------------------------------------------


def test_no_degradation_by_default() -> None:
    assert SimulatedProvider().degradation is None
    default = PackingDegradation()
    assert all(default.probability(k, p) == 0.0 for k in range(1, 40) for p in range(k))
    assert not any(default.degrades(f"item {n}", 32, 31) for n in range(200))


def test_the_chance_grows_with_size_and_position_past_free_items() -> None:
    degradation = PackingDegradation(base=0.1, per_extra_item=0.02, per_position=0.01, free_items=4)
    assert degradation.probability(1, 0) == 0.0
    assert degradation.probability(4, 3) == 0.0  # up to free_items: as good as plain
    assert degradation.probability(5, 0) == pytest.approx(0.12)
    assert degradation.probability(16, 0) == pytest.approx(0.1 + 0.02 * 12)
    assert degradation.probability(16, 15) == pytest.approx(0.1 + 0.02 * 12 + 0.01 * 15)
    assert degradation.probability(200, 150) == 1.0  # capped
    # A group of one degrades only when free_items says so.
    assert PackingDegradation(base=0.3, free_items=0).probability(1, 0) == 0.3


def test_later_positions_degrade_more() -> None:
    degradation = PackingDegradation(per_position=0.04, free_items=1)
    wrong = [sum(degradation.degrades(f"review {n}", 16, p) for n in range(500)) for p in range(16)]
    first, last = sum(wrong[:8]), sum(wrong[8:])
    assert (first, last) == (550, 1807)
    assert plausible(first, [0.04 * p for p in range(8)] * 500)
    assert plausible(last, [0.04 * p for p in range(8, 16)] * 500)
    assert wrong[0] == 0


def test_the_same_seed_gives_the_same_verdicts() -> None:
    def verdicts(seed: int) -> list[bool]:
        degradation = PackingDegradation(base=0.3, free_items=0, seed=seed)
        return [degradation.degrades({"n": n}, 8, n % 8) for n in range(400)]

    assert verdicts(7) == verdicts(7)
    assert verdicts(7) != verdicts(8)
    # The verdict is the item's, at its size and place, however it is asked.
    degradation = PackingDegradation(base=0.5, free_items=0)
    assert degradation.degrades({"b": 2, "a": 1}, 8, 3) == degradation.degrades(
        {"a": 1, "b": 2}, 8, 3
    )


@pytest.mark.parametrize(
    "output_type", [str, Label, bool, Annotated[int, Field(ge=1, le=5)], Ticket]
)
def test_a_wrong_answer_differs_and_follows_the_schema(output_type: Any) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(output_type)
    schema = adapter.json_schema()
    for n in range(50):
        item = {"n": n}
        wrong = degraded_output(item, schema)
        assert wrong != expected_output(item, schema)
        assert adapter.dump_python(adapter.validate_python(wrong), mode="json") == wrong
        assert degraded_output(item, schema) == wrong


def test_a_schema_with_one_answer_has_no_wrong_one() -> None:
    assert degraded_output("x", {"const": "yes"}) == "yes"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base": -0.1}, r"PackingDegradation\.base must be a number from 0 to 1"),
        ({"per_extra_item": 1.5}, r"per_extra_item must be a number from 0 to 1 .* got 1\.5"),
        ({"per_position": math.nan}, r"per_position must be a number from 0 to 1"),
        ({"per_position": "0.1"}, r"per_position must be a number from 0 to 1 .* got '0\.1'"),
        ({"base": True}, r"base must be a number"),
        ({"free_items": -1}, r"free_items must be a whole number >= 0 .* got -1"),
        ({"free_items": 2.5}, r"free_items must be a whole number >= 0"),
        ({"seed": "x"}, r"seed must be a whole number, got 'x'"),
    ],
)
def test_bad_parameters_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        PackingDegradation(**options)


def test_the_provider_takes_a_degradation_only() -> None:
    with pytest.raises(ConfigurationError, match="degradation must be a PackingDegradation"):
        SimulatedProvider(degradation={"base": 0.1})  # type: ignore[arg-type]


def test_configuration_file_and_command_line() -> None:
    sim = SimulatedProvider.from_config({"degradation": {"per_extra_item": 0.02, "free_items": 4}})
    assert sim.degradation == PackingDegradation(per_extra_item=0.02, free_items=4)
    with pytest.raises(ConfigurationError, match="invalid keys in 'degradation'"):
        SimulatedProvider.from_config({"degradation": {"per_item": 0.02}})
    with pytest.raises(ConfigurationError, match="per_position must be a number from 0 to 1"):
        SimulatedProvider.from_config({"degradation": {"per_position": 2}})
    args = build_parser().parse_args(["--degradation", "base=0.1,per_position=0.01,free_items=4"])
    assert cli_provider(args).degradation == PackingDegradation(
        base=0.1, per_position=0.01, free_items=4
    )
    assert cli_provider(build_parser().parse_args([])).degradation is None


@pytest.mark.parametrize("flag", ["per_item=0.1", "base=lots", "free_items=1.5"])
def test_a_bad_command_line_flag_exits_with_a_message(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--degradation", flag])
    assert exited.value.code == 2
    assert "--degradation" in capsys.readouterr().err


# -- through the SDKs, in process --------------------------------------------------------


async def ask_openai(
    sim: SimulatedProvider, inputs: list[Any], schema: Any, *, stream: bool = False, url: Any = None
) -> Any:
    """One packed request through the openai SDK: each item's output, in item order."""
    request = pack_request("Tag each item.", inputs, schema)
    async with sim.openai_client(url, max_retries=0) as client:
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.user},
            ],
            "response_format": openai_response_format(request.reply_schema),
        }
        if not stream:
            reply = await client.chat.completions.create(**kwargs)
            text = reply.choices[0].message.content or ""
        else:
            chunks = await client.chat.completions.create(**kwargs, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    results = json.loads(text)["results"]
    return [results[item_id] for item_id in request.ids]


async def ask_anthropic(
    sim: SimulatedProvider, inputs: list[Any], schema: Any, *, stream: bool = False, url: Any = None
) -> Any:
    """One packed request through the anthropic SDK (a forced tool): each item's output."""
    request = pack_request("Tag each item.", inputs, schema)
    tool = anthropic_tool(request.reply_schema)
    kwargs: dict[str, Any] = {
        "model": "claude-3-5-haiku-latest",
        "max_tokens": 4000,
        "system": request.system,
        "messages": [{"role": "user", "content": request.user}],
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": tool["name"]},
    }
    async with sim.anthropic_client(url, max_retries=0) as client:
        if stream:
            async with client.messages.stream(**kwargs) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(**kwargs)
    (block,) = message.content
    assert block.type == "tool_use"
    results: Any = block.input
    return [results["results"][item_id] for item_id in request.ids]


ASK = {"openai": ask_openai, "anthropic": ask_anthropic}


@SDK_STREAMS
@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_each_item_is_wrong_as_its_verdict_says(api: str, stream: bool) -> None:
    degradation = PackingDegradation(base=0.1, per_position=0.04, free_items=1)
    sim = SimulatedProvider(time_scale=0.01, degradation=degradation)
    inputs = [f"ticket {n}: my invoice is wrong" for n in range(16)]
    outputs = await ASK[api](sim, inputs, TICKET_SCHEMA, stream=stream)
    verdicts = [degradation.degrades(x, 16, p) for p, x in enumerate(inputs)]
    assert outputs == [
        (sim.degraded_output if wrong else sim.expected_output)(x, TICKET_SCHEMA)
        for x, wrong in zip(inputs, verdicts, strict=True)
    ]
    assert [Ticket.model_validate(o).model_dump(mode="json") for o in outputs] == outputs
    (record,) = sim.requests
    assert record.degraded == sum(verdicts) == 7
    assert sim.statistics().degraded == 7


@pytest.mark.anyio
@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_plain_request_is_never_degraded(api: str) -> None:
    sim = SimulatedProvider(time_scale=0.01, degradation=PackingDegradation(base=1, free_items=0))
    async with sim.openai_client(max_retries=0) as oai, sim.anthropic_client(max_retries=0) as ant:
        for n in range(20):
            question = f"is review {n} positive?"
            if api == "openai":
                reply = await oai.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": question}]
                )
                text = reply.choices[0].message.content
            else:
                message = await ant.messages.create(
                    model="claude-3-5-haiku-latest",
                    max_tokens=100,
                    messages=[{"role": "user", "content": question}],
                )
                block = message.content[0]
                text = block.text if block.type == "text" else None
            assert text == expected_output(question)
    assert [r.degraded for r in sim.requests] == [0] * 20


@pytest.mark.anyio
async def test_a_packed_group_of_one_counts_as_one() -> None:
    inputs = [[f"review {n}"] for n in range(10)]
    everything = SimulatedProvider(degradation=PackingDegradation(base=1, free_items=0))
    for single in inputs:
        assert await ask_openai(everything, single, LABEL_SCHEMA) == [
            degraded_output(single[0], LABEL_SCHEMA)
        ]
    assert [r.degraded for r in everything.requests] == [1] * 10
    free = SimulatedProvider(degradation=PackingDegradation(base=1))  # free_items=1
    for single in inputs:
        assert await ask_openai(free, single, LABEL_SCHEMA) == [
            expected_output(single[0], LABEL_SCHEMA)
        ]
    assert free.statistics().degraded == 0


@pytest.mark.anyio
async def test_up_to_free_items_nothing_is_degraded() -> None:
    degradation = PackingDegradation(base=1, per_extra_item=1, per_position=1, free_items=4)
    sim = SimulatedProvider(time_scale=0.01, degradation=degradation)
    for k in (1, 2, 3, 4):
        inputs = [f"k={k} review {n}" for n in range(k)]
        assert await ask_openai(sim, inputs, LABEL_SCHEMA) == [
            expected_output(x, LABEL_SCHEMA) for x in inputs
        ]
    inputs = [f"k=5 review {n}" for n in range(5)]
    assert await ask_openai(sim, inputs, LABEL_SCHEMA) == [
        degraded_output(x, LABEL_SCHEMA) for x in inputs
    ]
    assert [r.degraded for r in sim.requests] == [0, 0, 0, 0, 5]


@pytest.mark.anyio
async def test_at_large_k_the_configured_fraction_is_wrong() -> None:
    degradation = PackingDegradation(base=0.05, per_extra_item=0.01, free_items=4, seed=3)
    sim = SimulatedProvider(time_scale=0.01, degradation=degradation)
    wrong = 0
    for request in range(40):
        inputs = [f"review {request}-{n}" for n in range(16)]
        outputs = await ask_openai(sim, inputs, LABEL_SCHEMA)
        wrong += sum(
            o != expected_output(x, LABEL_SCHEMA) for o, x in zip(outputs, inputs, strict=True)
        )
    assert degradation.probability(16, 0) == pytest.approx(0.17)
    assert wrong == sim.statistics().degraded == 96
    assert plausible(wrong, [0.17] * 640)


@pytest.mark.anyio
async def test_the_verdicts_do_not_depend_on_request_order() -> None:
    groups = [[f"g{g} review {n}" for n in range(8)] for g in range(6)]
    degradation = PackingDegradation(base=0.3, per_position=0.05, free_items=2)
    forward = SimulatedProvider(degradation=degradation)
    backward = SimulatedProvider(degradation=degradation)
    answers = [await ask_openai(forward, g, LABEL_SCHEMA) for g in groups]
    reversed_answers = [await ask_openai(backward, g, LABEL_SCHEMA) for g in groups[::-1]]
    assert answers == reversed_answers[::-1]
    reseeded = SimulatedProvider(
        degradation=PackingDegradation(base=0.3, per_position=0.05, free_items=2, seed=1)
    )
    assert answers != [await ask_openai(reseeded, g, LABEL_SCHEMA) for g in groups]


# -- through @coalesce.prompt -----------------------------------------------------------


async def label_all(sim: SimulatedProvider, reviews: list[str], max_items: int) -> list[Any]:
    @coalesce.prompt(
        packing="always",
        client=sim.openai_client(max_retries=0),
        model=MODEL,
        max_items=max_items,
        max_wait=1.0,
    )
    async def label(review: str) -> Label:
        """Is the movie review positive or negative?"""

    results: list[Any] = [None] * len(reviews)

    async def one(index: int) -> None:
        results[index] = await label(reviews[index])

    async with anyio.create_task_group() as group:
        for index in range(len(reviews)):
            group.start_soon(one, index)
            # One caller at a time, so each group's order is the callers' (trio would
            # shuffle them), and so is each answer's verdict.
            await anyio.wait_all_tasks_blocked()
    await label.aclose()
    return results


@pytest.mark.anyio
async def test_packed_callers_get_wrong_answers_at_the_configured_rate() -> None:
    degradation = PackingDegradation(per_extra_item=0.01, per_position=0.02, free_items=4)
    reviews = [f"review {n}: the plot was thin but the acting saved it" for n in range(320)]
    packed = SimulatedProvider(time_scale=0.01, degradation=degradation)
    answers = await label_all(packed, reviews, max_items=16)
    assert {r.items for r in packed.requests} == {16}
    verdicts = [degradation.degrades(r, 16, n % 16) for n, r in enumerate(reviews)]
    assert answers == [
        (degraded_output if wrong else expected_output)(r, LABEL_SCHEMA)
        for r, wrong in zip(reviews, verdicts, strict=True)
    ]
    assert sum(verdicts) == packed.statistics().degraded == 86
    assert plausible(sum(verdicts), [degradation.probability(16, p) for p in range(16)] * 20)

    alone = SimulatedProvider(time_scale=0.01, degradation=degradation)
    right = [expected_output(r, LABEL_SCHEMA) for r in reviews[:64]]
    assert await label_all(alone, reviews[:64], max_items=1) == right
    assert {r.items for r in alone.requests} == {1}
    assert alone.statistics().degraded == 0


# -- over real HTTP ----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # real time: a real socket
async def test_over_http_the_stats_count_degraded_answers() -> None:
    degradation = PackingDegradation(base=0.5, free_items=1)
    sim = SimulatedProvider(time_scale=0.001, degradation=degradation)
    inputs = [f"ticket {n}" for n in range(12)]
    async with sim.serve_async() as url:
        answers = [await ask(sim, inputs, LABEL_SCHEMA, url=url) for ask in ASK.values()]
        async with httpx2.AsyncClient() as http:
            stats = (await http.get(f"{url}/_sim/stats")).json()
    verdicts = [degradation.degrades(x, 12, p) for p, x in enumerate(inputs)]
    expected = [
        (degraded_output if wrong else expected_output)(x, LABEL_SCHEMA)
        for x, wrong in zip(inputs, verdicts, strict=True)
    ]
    assert answers == [expected, expected]
    assert [r["degraded"] for r in stats["requests"]] == [sum(verdicts)] * 2 == [5, 5]
    assert stats["totals"]["degraded"] == 10

"""The ``duplicate_id_wrong_first`` fault and never-ending hangs, through both SDKs.

A provider that ignores the reply schema may write an id twice, the wrong answer
first: a caller answered at the first occurrence gets the wrong one. The simulator
writes it that way, streamed or not, in the OpenAI and the Anthropic (forced tool)
flavours. Runs on virtual time (both backends).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import AsyncIterator
from typing import Any, Literal

import anthropic
import anyio
import openai
import pytest
from pydantic import BaseModel

from coalesce._exceptions import ConfigurationError
from coalesce._wire.packing import pack_request
from coalesce.providers._shapes import anthropic_tool, openai_response_format
from coalesce.testing import Fault, FaultPlan, SimulatedProvider, expected_output
from coalesce.testing._faults import damage_results, wrong_output

MODEL = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-latest"
FAULT = "duplicate_id_wrong_first"

SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)


class Verdict(BaseModel):
    label: Literal["spam", "ham"]
    score: int


SCHEMA = Verdict.model_json_schema()
INPUTS = [f"mail {n}" for n in range(6)]
RESULTS = [{"id": str(i), "output": f"o{i}"} for i in range(1, 6)]


def repeated(pairs: list[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """The one id written twice, and its outputs in the order written."""
    ids = [key for key, _ in pairs]
    (twice,) = {key for key in ids if ids.count(key) == 2}
    assert len(ids) == len(set(ids)) + 1
    return twice, [value for key, value in pairs if key == twice]


def assert_wrong_then_right(pairs: list[tuple[str, Any]], ids: list[str]) -> None:
    """The repeated id's first output is wrong but valid, its second is its answer."""
    twice, (first, second) = repeated(pairs)
    right = expected_output(INPUTS[ids.index(twice)], SCHEMA)
    assert second == right
    assert first != right
    Verdict.model_validate(first)  # wrong, not malformed: only the repeat gives it away


def keyed_pairs(text: str) -> list[tuple[str, Any]]:
    """Every member of ``{"results": {...}}`` as written, repeats included."""
    outer = json.loads(text, object_pairs_hook=list)
    (results,) = [value for key, value in outer if key == "results"]
    return [(key, dict(value)) for key, value in results]


def listed_pairs(value: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every entry of ``{"results": [{"id", "output"}, ...]}``, in order."""
    return [(entry["id"], entry["output"]) for entry in value["results"]]


# -- pure -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "wrong_at"), [(Fault.DUPLICATE_ID_WRONG_FIRST, 0), (Fault.DUPLICATE_ID, 1)]
)
def test_twin_order(fault: Fault, wrong_at: int) -> None:
    out, applied = damage_results(RESULTS, frozenset({fault}), random.Random(3))
    assert applied == {fault}
    twice, outputs = repeated([(r["id"], r["output"]) for r in out])
    right = next(r["output"] for r in RESULTS if r["id"] == twice)
    assert outputs[1 - wrong_at] == right
    assert outputs[wrong_at] != right


def test_wrong_output_follows_the_schema_and_differs() -> None:
    for i in range(20):
        original = {"id": str(i), "output": expected_output(i, SCHEMA)}
        wrong = wrong_output(original, SCHEMA)
        assert wrong != original["output"]
        Verdict.model_validate(wrong)
    # Two choices only: drawn again until it differs.
    binary = {"enum": ["yes", "no"]}
    for i in range(20):
        original = {"id": str(i), "output": expected_output(i, binary)}
        assert wrong_output(original, binary) in {"yes", "no"} - {original["output"]}


def test_fault_by_name_probability_and_configuration() -> None:
    assert Fault(FAULT) is Fault.DUPLICATE_ID_WRONG_FIRST
    sim = SimulatedProvider.from_config({"faults": {"probabilities": {FAULT: 1.0}, "seed": 2}})
    assert sim.faults.next() == {Fault.DUPLICATE_ID_WRONG_FIRST}


def test_hang_seconds_is_checked_and_may_be_infinite() -> None:
    assert FaultPlan(hang_seconds=math.inf).hang_seconds == math.inf
    config = json.loads('{"faults": {"hang_seconds": Infinity}}')
    assert SimulatedProvider.from_config(config).fault_plan.hang_seconds == math.inf
    for bad in (-1.0, math.nan):
        with pytest.raises(ConfigurationError, match="hang_seconds must be >= 0"):
            FaultPlan(hang_seconds=bad)


# -- through the SDKs, in process -----------------------------------------------------


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(faults=FaultPlan(probabilities={FAULT: 1.0}, seed=1))


@pytest.fixture
async def oai(sim: SimulatedProvider) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sim.openai_client(max_retries=0) as client:
        yield client


@pytest.fixture
async def claude(sim: SimulatedProvider) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with sim.anthropic_client(max_retries=0) as client:
        yield client


def chat_request() -> tuple[dict[str, Any], list[str]]:
    request = pack_request("Tag each mail.", INPUTS, SCHEMA)
    kwargs = {
        "model": MODEL,
        "messages": request.messages(),
        "response_format": openai_response_format(request.reply_schema),
    }
    return kwargs, list(request.ids)


def tool_request(*, keyed: bool = True) -> tuple[dict[str, Any], list[str]]:
    request = pack_request("Tag each mail.", INPUTS, SCHEMA, keyed=keyed)
    tool = anthropic_tool(request.reply_schema)
    kwargs = {
        "model": CLAUDE,
        "max_tokens": 2000,
        "system": request.system,
        "messages": [{"role": "user", "content": request.user}],
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": tool["name"]},
    }
    return kwargs, list(request.ids)


@pytest.mark.anyio
async def test_openai_not_streamed(sim: SimulatedProvider, oai: openai.AsyncOpenAI) -> None:
    kwargs, ids = chat_request()
    reply = await oai.chat.completions.create(**kwargs)
    assert_wrong_then_right(keyed_pairs(reply.choices[0].message.content or ""), ids)
    assert sim.requests[-1].faults == (FAULT,)


@SDK_STREAMS
@pytest.mark.anyio
async def test_openai_streamed(sim: SimulatedProvider, oai: openai.AsyncOpenAI) -> None:
    kwargs, ids = chat_request()
    stream = await oai.chat.completions.create(**kwargs, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert_wrong_then_right(keyed_pairs(text), ids)
    assert sim.requests[-1].faults == (FAULT,)


@pytest.mark.anyio
async def test_anthropic_tool_streamed(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    kwargs, ids = tool_request()
    stream = await claude.messages.create(**kwargs, stream=True)
    pieces = [
        event.delta.partial_json
        async for event in stream
        if event.type == "content_block_delta" and event.delta.type == "input_json_delta"
    ]
    assert_wrong_then_right(keyed_pairs("".join(pieces)), ids)
    assert sim.requests[-1].faults == (FAULT,)


@pytest.mark.anyio
async def test_anthropic_tool_not_streamed(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    # Format 1 (a list) keeps both entries through the parsed tool input.
    kwargs, ids = tool_request(keyed=False)
    message = await claude.messages.create(**kwargs)
    (block,) = message.content
    assert block.type == "tool_use"
    assert_wrong_then_right(listed_pairs(dict(block.input)), ids)
    # Format 2 (an object) cannot hold a key twice once parsed: the last, right, one stays.
    kwargs, ids = tool_request(keyed=True)
    message = await claude.messages.create(**kwargs)
    (block,) = message.content
    assert block.type == "tool_use"
    results: Any = dict(block.input)["results"]
    assert results == {i: expected_output(x, SCHEMA) for i, x in zip(ids, INPUTS, strict=True)}
    assert [r.faults for r in sim.requests] == [(FAULT,), (FAULT,)]


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_infinite_hang_lasts_until_the_client_leaves(stream: bool) -> None:
    sim = SimulatedProvider(faults=FaultPlan(script=["hang"], hang_seconds=math.inf))
    async with sim.openai_client(max_retries=0) as client:
        with anyio.move_on_after(1e6) as scope:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], stream=stream
            )
    assert scope.cancelled_caught
    (record,) = sim.requests
    assert (record.status, record.faults) == (499, ("hang",))

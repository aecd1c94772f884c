"""What frameworks send besides a ``json_schema`` format, through the official SDKs, in
process: forced tools in Chat Completions, ``json_object`` with the schema in the
prompt, Anthropic's structured outputs (``output_config``) and ``tool_choice`` ``any``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import anthropic
import openai
import pytest
from pydantic import BaseModel

from coalesce._wire.packing import pack_request, split_reply
from coalesce._wire.plain import plain_request, split_plain
from coalesce.providers._shapes import anthropic_tool, strict_openai_schema
from coalesce.testing import LatencyProfile, SimulatedLatency, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

PROFILE = LatencyProfile(ttft=0.3, prompt_token_seconds=0.0, tokens_per_second=100)
GPT = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-latest"

# The openai SDK stops reading its SSE generators at [DONE] without closing them;
# trio warns when such a generator is collected. Nothing the simulator can change.
SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)


class Tag(BaseModel):
    label: Literal["billing", "bug", "other"]
    urgent: bool


TAG = Tag.model_json_schema()
STRICT_TAG = strict_openai_schema(TAG)

# instructor's JSON mode: the schema in the system message, response_format json_object.
INSTRUCTOR_SYSTEM = (
    "As a genius expert, your task is to understand the content and provide\n"
    "the parsed objects in json that match the following json_schema:\n\n"
    f"{json.dumps(TAG, indent=2, ensure_ascii=False)}\n\n"
    "Make sure to return an instance of the JSON, not the schema itself"
)


def as_any(value: Any) -> Any:
    """``value``, for an SDK argument its TypedDicts cannot describe."""
    return value


def function(name: str = "tag", schema: Any = TAG) -> Any:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(latency=SimulatedLatency(default=PROFILE))


@pytest.fixture
async def gpt(sim: SimulatedProvider) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sim.openai_client(max_retries=0) as client:
        yield client


@pytest.fixture
async def claude(sim: SimulatedProvider) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with sim.anthropic_client(max_retries=0) as client:
        yield client


# ------------------------------------------------------------- chat tool calls


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "tag"}}],
    ids=["required", "named"],
)
async def test_forced_tool_is_a_tool_call(
    sim: SimulatedProvider, gpt: openai.AsyncOpenAI, choice: Any
) -> None:
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=[{"role": "user", "content": "the app crashes"}],
        tools=[function()],
        tool_choice=choice,
    )
    (choice_,) = reply.choices
    assert choice_.finish_reason == "tool_calls"
    assert choice_.message.content is None
    assert choice_.message.tool_calls is not None
    (call,) = choice_.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "tag"
    # The arguments are what a json_schema response_format gets: compact JSON.
    expected = expected_output("the app crashes", TAG)
    assert call.function.arguments == json.dumps(expected, separators=(",", ":"))
    (record,) = sim.requests
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
    assert record.api == "openai.chat"


async def test_tool_definitions_count_as_prompt_tokens(
    sim: SimulatedProvider, gpt: openai.AsyncOpenAI
) -> None:
    messages: Any = [{"role": "user", "content": "x"}]
    await gpt.chat.completions.create(model=GPT, messages=messages)
    await gpt.chat.completions.create(model=GPT, messages=messages, tools=[function()])
    plain, with_tools = sim.requests
    assert with_tools.prompt_tokens > plain.prompt_tokens + 10


async def test_each_call_gets_its_own_id(gpt: openai.AsyncOpenAI) -> None:
    ids = set()
    for _ in range(3):
        reply = await gpt.chat.completions.create(
            model=GPT,
            messages=[{"role": "user", "content": "x"}],
            tools=[function()],
            tool_choice="required",
        )
        assert reply.choices[0].message.tool_calls is not None
        ids.add(reply.choices[0].message.tool_calls[0].id)
    assert len(ids) == 3


async def test_auto_tool_choice_answers_text(gpt: openai.AsyncOpenAI) -> None:
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=[{"role": "user", "content": "x"}],
        tools=[function()],
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == expected_output("x")


async def test_the_named_tool_among_several(gpt: openai.AsyncOpenAI) -> None:
    other = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=[{"role": "user", "content": "x"}],
        tools=[function(), function("count", other)],
        tool_choice={"type": "function", "function": {"name": "count"}},
    )
    assert reply.choices[0].message.tool_calls is not None
    (call,) = reply.choices[0].message.tool_calls
    assert call.type == "function"
    assert call.function.name == "count"
    assert json.loads(call.function.arguments) == expected_output("x", other)


async def test_an_unknown_tool_name_is_a_400(gpt: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="nope"):
        await gpt.chat.completions.create(
            model=GPT,
            messages=[{"role": "user", "content": "x"}],
            tools=[function()],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )


async def test_packed_items_through_a_forced_tool(
    sim: SimulatedProvider, gpt: openai.AsyncOpenAI
) -> None:
    inputs = [f"ticket {n}" for n in range(6)]
    request = pack_request("Tag each ticket.", inputs, TAG)
    tool = function("coalesce_results", strict_openai_schema(request.reply_schema))
    messages: Any = request.messages()
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=messages,
        tools=[tool],
        tool_choice="required",
    )
    assert reply.choices[0].message.tool_calls is not None
    (call,) = reply.choices[0].message.tool_calls
    assert call.type == "function"
    split = split_reply(call.function.arguments, request.ids, Tag.model_validate)
    assert split.values == {
        i: Tag.model_validate(expected_output(x, TAG))
        for i, x in zip(request.ids, inputs, strict=True)
    }
    assert sim.requests[-1].items == 6


async def test_parse_with_a_pydantic_function_tool(gpt: openai.AsyncOpenAI) -> None:
    reply = await gpt.chat.completions.parse(
        model=GPT,
        messages=[{"role": "user", "content": "refund please"}],
        tools=[openai.pydantic_function_tool(Tag)],
        tool_choice={"type": "function", "function": {"name": "Tag"}},
    )
    assert reply.choices[0].message.tool_calls is not None
    (call,) = reply.choices[0].message.tool_calls
    schema = openai.pydantic_function_tool(Tag)["function"]["parameters"]
    assert call.function.parsed_arguments == Tag.model_validate(
        expected_output("refund please", schema)
    )


@SDK_STREAMS
async def test_streamed_tool_call_deltas(sim: SimulatedProvider, gpt: openai.AsyncOpenAI) -> None:
    kwargs: Any = {
        "model": GPT,
        "messages": [{"role": "user", "content": "the app crashes"}],
        "tools": [function()],
        "tool_choice": "required",
    }
    whole = await gpt.chat.completions.create(**kwargs)
    stream = await gpt.chat.completions.create(**kwargs, stream=True)
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks]
    first = deltas[0].tool_calls
    assert first is not None
    assert (first[0].index, first[0].type) == (0, "function")
    assert first[0].id is not None
    assert first[0].id.startswith("call_")
    assert first[0].function is not None
    assert first[0].function.name == "tag"
    assert all(d.content is None for d in deltas)
    arguments = "".join(
        call.function.arguments or ""
        for d in deltas
        for call in d.tool_calls or []
        if call.function is not None
    )
    assert whole.choices[0].message.tool_calls is not None
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    assert len(deltas) > 3
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert sim.requests[-1].stream


@SDK_STREAMS
async def test_the_sdk_stream_helper_assembles_the_tool_call(gpt: openai.AsyncOpenAI) -> None:
    async with gpt.chat.completions.stream(
        model=GPT,
        messages=[{"role": "user", "content": "refund please"}],
        tools=[openai.pydantic_function_tool(Tag)],
        tool_choice="required",
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    assert "tool_calls.function.arguments.done" in kinds
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.choices[0].message.tool_calls is not None
    parsed = final.choices[0].message.tool_calls[0].function.parsed_arguments
    schema = openai.pydantic_function_tool(Tag)["function"]["parameters"]
    assert parsed == Tag.model_validate(expected_output("refund please", schema))


async def test_faults_on_a_tool_call(sim: SimulatedProvider, gpt: openai.AsyncOpenAI) -> None:
    kwargs: Any = {
        "model": GPT,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [function()],
        "tool_choice": "required",
    }
    sim.inject("prose", "truncate")
    prose = await gpt.chat.completions.create(**kwargs)
    cut = await gpt.chat.completions.create(**kwargs)
    # The model answered in prose instead of calling the tool.
    assert prose.choices[0].finish_reason == "stop"
    assert prose.choices[0].message.tool_calls is None
    assert (prose.choices[0].message.content or "").startswith("Sure!")
    # Cut off: the call is there, its arguments unfinished.
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.tool_calls is not None
    arguments = cut.choices[0].message.tool_calls[0].function.arguments
    full = json.dumps(expected_output("x", TAG), separators=(",", ":"))
    assert full.startswith(arguments)
    assert arguments != full


# ------------------------------------------------------------------- json_object


async def test_json_object_follows_the_schema_in_the_instructions(
    gpt: openai.AsyncOpenAI,
) -> None:
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=[
            {"role": "system", "content": INSTRUCTOR_SYSTEM},
            {"role": "user", "content": "the app crashes"},
        ],
        response_format={"type": "json_object"},
    )
    content = reply.choices[0].message.content or ""
    assert Tag.model_validate_json(content) == Tag.model_validate(
        expected_output("the app crashes", TAG)
    )
    assert json.loads(content) == expected_output("the app crashes", TAG)


async def test_json_object_follows_a_schema_in_the_user_message(gpt: openai.AsyncOpenAI) -> None:
    question = f"Tag 'refund please' as JSON valid against {json.dumps(TAG)}"
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=[{"role": "user", "content": question}],
        response_format={"type": "json_object"},
    )
    assert json.loads(reply.choices[0].message.content or "") == expected_output(question, TAG)


async def test_json_object_without_a_schema_keeps_the_output_wrapper(
    gpt: openai.AsyncOpenAI,
) -> None:
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=[
            {"role": "system", "content": 'Reply as JSON like {"label": "x"}.'},
            {"role": "user", "content": "q"},
        ],
        response_format={"type": "json_object"},
    )
    assert json.loads(reply.choices[0].message.content or "") == {"output": expected_output("q")}


@pytest.mark.parametrize("keyed", [True, False])
async def test_json_object_answers_an_unstructured_packed_prompt_per_item(
    sim: SimulatedProvider, gpt: openai.AsyncOpenAI, keyed: bool
) -> None:
    inputs = [{"text": f"ticket {n}"} for n in range(5)]
    request = pack_request("Tag each ticket.", inputs, TAG, structured=False, keyed=keyed)
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=as_any(request.messages()),
        response_format={"type": "json_object"},
    )
    content = reply.choices[0].message.content or ""
    split = split_reply(content, request.ids, Tag.model_validate)
    assert not split.failures
    assert split.values == {
        i: Tag.model_validate(expected_output(x, TAG))
        for i, x in zip(request.ids, inputs, strict=True)
    }
    results = json.loads(content)["results"]
    assert isinstance(results, dict) is keyed
    assert sim.requests[-1].items == 5


async def test_json_object_answers_an_unstructured_plain_call(gpt: openai.AsyncOpenAI) -> None:
    request = plain_request("Tag the ticket.", "the app crashes", TAG, structured=False)
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=as_any(request.messages()),
        response_format={"type": "json_object"},
    )
    split = split_plain(reply.choices[0].message.content or "", Tag.model_validate)
    assert split.values == {"1": Tag.model_validate(expected_output("the app crashes", TAG))}


async def test_json_object_answers_a_wrapped_scalar(gpt: openai.AsyncOpenAI) -> None:
    schema = {"enum": ["low", "high"], "type": "string"}
    request = plain_request("Rate it.", "the app crashes", schema, structured=False)
    reply = await gpt.chat.completions.create(
        model=GPT,
        messages=as_any(request.messages()),
        response_format={"type": "json_object"},
    )
    split = split_plain(reply.choices[0].message.content or "", str, wrapped=True)
    assert split.values == {"1": expected_output("the app crashes", schema)}


async def test_responses_json_object_follows_the_instructions(gpt: openai.AsyncOpenAI) -> None:
    response = await gpt.responses.create(
        model=GPT,
        instructions=INSTRUCTOR_SYSTEM,
        input="the app crashes",
        text={"format": {"type": "json_object"}},
    )
    assert json.loads(response.output_text) == expected_output("the app crashes", TAG)


# ------------------------------------------------------- Anthropic structured outputs


def output_config(schema: Any) -> Any:
    return {"format": {"type": "json_schema", "schema": schema}}


async def test_output_config_is_answered_as_json_text(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    message = await claude.messages.create(
        model=CLAUDE,
        max_tokens=200,
        messages=[{"role": "user", "content": "the app crashes"}],
        output_config=output_config(STRICT_TAG),
    )
    (block,) = message.content
    assert block.type == "text"
    expected = expected_output("the app crashes", STRICT_TAG)
    assert block.text == json.dumps(expected, separators=(",", ":"))
    assert message.stop_reason == "end_turn"
    (record,) = sim.requests
    assert record.api == "anthropic.messages"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (
        record.prompt_tokens,
        record.completion_tokens,
    )


async def test_parse_with_an_output_format_model(claude: anthropic.AsyncAnthropic) -> None:
    message = await claude.messages.parse(
        model=CLAUDE,
        max_tokens=200,
        messages=[{"role": "user", "content": "refund please"}],
        output_format=Tag,
    )
    assert message.parsed_output == Tag.model_validate(expected_output("refund please", TAG))


async def test_streamed_output_config(claude: anthropic.AsyncAnthropic) -> None:
    kwargs: Any = {
        "model": CLAUDE,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "refund please"}],
        "output_config": output_config(STRICT_TAG),
    }
    whole = await claude.messages.create(**kwargs)
    async with claude.messages.stream(**kwargs) as stream:
        text = "".join([chunk async for chunk in stream.text_stream])
        final = await stream.get_final_message()
    assert whole.content[0].type == "text"
    assert text == whole.content[0].text
    assert final.stop_reason == "end_turn"


async def test_packed_items_through_output_config(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    inputs = [f"ticket {n}" for n in range(4)]
    request = pack_request("Tag each ticket.", inputs, TAG)
    message = await claude.messages.create(
        model=CLAUDE,
        max_tokens=1000,
        system=request.system,
        messages=[{"role": "user", "content": request.user}],
        output_config=output_config(strict_openai_schema(request.reply_schema)),
    )
    assert message.content[0].type == "text"
    split = split_reply(message.content[0].text, request.ids, Tag.model_validate)
    assert split.values == {
        i: Tag.model_validate(expected_output(x, TAG))
        for i, x in zip(request.ids, inputs, strict=True)
    }
    assert sim.requests[-1].items == 4


async def test_output_config_that_is_not_a_schema_is_a_400(
    claude: anthropic.AsyncAnthropic,
) -> None:
    with pytest.raises(anthropic.BadRequestError, match="output_config"):
        await claude.messages.create(
            model=CLAUDE,
            max_tokens=10,
            messages=[{"role": "user", "content": "x"}],
            output_config=as_any({"format": {"type": "text"}}),
        )


async def test_tool_choice_any_with_one_tool_is_a_tool_use(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    message = await claude.messages.create(
        model=CLAUDE,
        max_tokens=200,
        messages=[{"role": "user", "content": [{"type": "text", "text": "the app crashes"}]}],
        tools=[{"name": "tag", "description": "Tag it.", "input_schema": TAG}],
        tool_choice={"type": "any"},
    )
    (block,) = message.content
    assert block.type == "tool_use"
    assert block.name == "tag"
    assert block.id.startswith("toolu_")
    assert block.input == expected_output("the app crashes", TAG)
    assert message.stop_reason == "tool_use"


async def test_tool_choice_any_carries_packed_items(claude: anthropic.AsyncAnthropic) -> None:
    inputs = ["a", "b", "c"]
    request = pack_request("Tag each.", inputs, TAG)
    message = await claude.messages.create(
        model=CLAUDE,
        max_tokens=1000,
        system=request.system,
        messages=[{"role": "user", "content": request.user}],
        tools=[as_any(anthropic_tool(request.reply_schema))],
        tool_choice={"type": "any"},
    )
    (block,) = message.content
    assert block.type == "tool_use"
    split = split_reply(json.dumps(block.input), request.ids, Tag.model_validate)
    assert split.values == {
        i: Tag.model_validate(expected_output(x, TAG))
        for i, x in zip(request.ids, inputs, strict=True)
    }


async def test_a_forced_tool_wins_over_output_config(claude: anthropic.AsyncAnthropic) -> None:
    message = await claude.messages.create(
        model=CLAUDE,
        max_tokens=200,
        messages=[{"role": "user", "content": "x"}],
        tools=[{"name": "tag", "input_schema": TAG}],
        tool_choice={"type": "tool", "name": "tag"},
        output_config=output_config({"type": "object", "properties": {}}),
    )
    (block,) = message.content
    assert block.type == "tool_use"
    assert block.input == expected_output("x", TAG)

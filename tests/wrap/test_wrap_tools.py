"""A forced single tool is a structured output: OpenAI chat ``tools=[f]`` with
``tool_choice`` forcing ``f`` or ``"required"``, Anthropic ``tool_choice`` ``tool`` or
``any`` with one tool. The tool's schema is the output schema, the packed request is an
ordinary structured request, and each caller gets a tool call of its own. Several tools,
a tool the model may skip, or a tool of another kind pass through untouched. Pure reads
first, then the official SDKs against the simulated provider in process, on virtual
time."""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pydantic
import pytest
from _wrapping import SCHEMA, accumulated, gather, msg
from _wrapping import chat as wrapping_chat
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ParsedChatCompletion

from coalesce._wrap import wrap
from coalesce._wrap.anthropic_messages import anthropic_create_call
from coalesce._wrap.openai_chat import openai_create_call
from coalesce._wrap.openai_parse import openai_parse_call
from coalesce._wrap.tools import ForcedTool, anthropic_forced_tool, openai_forced_tool
from coalesce.testing import SimulatedProvider

OTHER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
SYSTEM = {"role": "system", "content": "Classify the mail."}
FUNCTION = {"name": "verdict", "description": "Record the verdict.", "parameters": SCHEMA}
TOOL = {"type": "function", "function": FUNCTION}
FORCED = {"type": "function", "function": {"name": "verdict"}}
ANTHROPIC_TOOL = {"name": "verdict", "description": "Record the verdict.", "input_schema": SCHEMA}


class Verdict(pydantic.BaseModel):
    """Record the verdict."""

    label: Literal["spam", "ham"]
    score: int


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return wrapping_chat(text, system=SYSTEM, **extra)


# -- pure reads -----------------------------------------------------------------------


@pytest.mark.parametrize("choice", [FORCED, "required"])
def test_an_openai_forced_tool_is_the_output_schema(choice: Any) -> None:
    call = openai_create_call(chat("x", tools=[TOOL], tool_choice=choice))
    assert call is not None
    assert (call.output_schema, call.tool, call.options) == (SCHEMA, "verdict", {})
    assert "'verdict' (Record the verdict.)" in call.instructions
    assert call.instructions.startswith("Classify the mail.")
    same = openai_create_call(
        chat("y", tools=[TOOL], tool_choice=choice, parallel_tool_calls=False)
    )
    assert same is not None
    assert same.key == call.key
    rf = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
    structured = openai_create_call(chat("x", response_format=rf))
    assert structured is not None
    assert structured.key != call.key  # the caller gets another kind of reply


def test_tool_names_and_descriptions_key_the_call() -> None:
    call = openai_create_call(chat("x", tools=[TOOL], tool_choice="required"))
    renamed = {"type": "function", "function": {**FUNCTION, "name": "label"}}
    described = {"type": "function", "function": {**FUNCTION, "description": "Other."}}
    keys = {
        call.key if call is not None else None,
        *(
            getattr(openai_create_call(chat("x", tools=[t], tool_choice="required")), "key", None)
            for t in (renamed, described)
        ),
    }
    assert None not in keys
    assert len(keys) == 3


def test_an_anthropic_forced_tool_is_the_output_schema() -> None:
    named = anthropic_create_call(
        msg("x", tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "verdict"})
    )
    anyone = anthropic_create_call(
        msg(
            "x",
            tools=[ANTHROPIC_TOOL],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
        )
    )
    assert named is not None
    assert anyone is not None
    assert (anyone.output_schema, anyone.tool) == (SCHEMA, "verdict")
    assert anyone.key == named.key
    assert "'verdict' (Record the verdict.)" in anyone.instructions


def test_forced_tool_reads() -> None:
    assert openai_forced_tool(None, None) is None
    assert openai_forced_tool([TOOL], "required") == ForcedTool(
        "verdict", SCHEMA, "Record the verdict."
    )
    assert anthropic_forced_tool(None, None) is None
    bare = {"name": "out", "input_schema": OTHER}
    assert anthropic_forced_tool([bare], {"type": "any"}) == ForcedTool("out", OTHER)
    assert ForcedTool("out", OTHER).instruction() == (
        "Each item's output is the arguments of one call to the tool 'out',"
        " following the output schema."
    )


SECOND = {"type": "function", "function": {"name": "other", "parameters": OTHER}}


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [TOOL]},  # the model may answer in text
        {"tools": [TOOL], "tool_choice": "auto"},
        {"tools": [TOOL], "tool_choice": "none"},
        {"tools": [TOOL, SECOND], "tool_choice": "required"},
        {"tools": [TOOL, SECOND], "tool_choice": FORCED},
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
        {"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}},
        {"tools": [{"type": "custom", "custom": {"name": "verdict"}}], "tool_choice": "required"},
        {
            "tools": [{"type": "function", "function": {"name": "verdict"}}],
            "tool_choice": "required",
        },
        {
            "tools": [{"type": "function", "function": {**FUNCTION, "x": 1}}],
            "tool_choice": "required",
        },
        {"tools": [{**TOOL, "x": 1}], "tool_choice": "required"},
        {"tools": TOOL, "tool_choice": "required"},
        {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": "no"},
        {"tool_choice": "required"},
        {"parallel_tool_calls": False},
        {"functions": [FUNCTION], "function_call": {"name": "verdict"}},
        {
            "tools": [TOOL],
            "tool_choice": "required",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": SCHEMA},
            },
        },
        {"tools": [TOOL], "tool_choice": "required", "n": 2},
    ],
)
def test_openai_tools_that_are_not_one_forced_tool_pass_through(extra: dict[str, Any]) -> None:
    assert openai_create_call(chat("x", **extra)) is None


ANTHROPIC_SECOND = {"name": "other", "input_schema": OTHER}


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [ANTHROPIC_TOOL]},
        {"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "auto"}},
        {"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "none"}},
        {"tools": [ANTHROPIC_TOOL, ANTHROPIC_SECOND], "tool_choice": {"type": "any"}},
        {
            "tools": [ANTHROPIC_TOOL, ANTHROPIC_SECOND],
            "tool_choice": {"type": "tool", "name": "verdict"},
        },
        {"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "tool", "name": "other"}},
        {"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any", "name": "verdict"}},
        {"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any", "x": 1}},
        {
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "any"},
        },
        {"tools": [{"name": "verdict"}], "tool_choice": {"type": "any"}},
        {"tools": [{**ANTHROPIC_TOOL, "x": 1}], "tool_choice": {"type": "any"}},
        {"tool_choice": {"type": "any"}},
        {
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "any"},
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
        },
    ],
)
def test_anthropic_tools_that_are_not_one_forced_tool_pass_through(extra: dict[str, Any]) -> None:
    assert anthropic_create_call(msg("x", **extra)) is None


def test_parse_reads_a_strict_forced_tool_and_leaves_the_others_to_the_sdk() -> None:
    tool = openai.pydantic_function_tool(Verdict)
    parsed = openai_parse_call(chat("x", tools=[tool], tool_choice="required"))
    assert parsed is not None
    assert (parsed.tool, parsed.output_schema) == ("Verdict", tool["function"]["parameters"])
    # parse() refuses a tool that is not strict itself: its own error, not ours.
    assert openai_parse_call(chat("x", tools=[TOOL], tool_choice="required")) is None


# -- against the simulated provider ---------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("choice", [FORCED, "required"])
async def test_openai_forced_tool_callers_get_their_own_tool_calls(choice: Any) -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:
        replies = await gather(
            8,
            lambda i: client.chat.completions.create(
                **chat(f"mail {i}", tools=[TOOL], tool_choice=choice, parallel_tool_calls=False)
            ),
        )
    assert [r.items for r in sim.requests] == [4, 4]
    ids = set()
    for i, reply in enumerate(replies):
        assert isinstance(reply, ChatCompletion)
        choice_ = reply.choices[0]
        assert (choice_.finish_reason, choice_.message.content) == ("tool_calls", None)
        (call,) = choice_.message.tool_calls or []
        assert call.type == "function"
        assert call.id.startswith("call_")
        assert call.function.name == "verdict"
        assert json.loads(call.function.arguments) == sim.expected_output(f"mail {i}", SCHEMA)
        assert ChatCompletion.model_validate(reply.model_dump()) == reply
        ids.add(call.id)
    assert len(ids) == 8
    stats = sim.statistics()
    usages = [r.usage for r in replies if r.usage is not None]
    assert sum(u.prompt_tokens for u in usages) == stats.prompt_tokens
    assert sum(u.completion_tokens for u in usages) == stats.completion_tokens


@pytest.mark.anyio
async def test_streamed_openai_tool_calls_are_the_sdks_own_deltas() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=3, packing="always") as client:

        async def ask(i: int) -> tuple[Any, Any]:
            stream = await client.chat.completions.create(
                **chat(
                    f"s{i}",
                    tools=[TOOL],
                    tool_choice=FORCED,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(input_tools=[TOOL])  # type: ignore[list-item]
            chunks = [chunk async for chunk in stream]
            for chunk in chunks:
                state.handle_chunk(chunk)
            return state.get_final_completion(), chunks[-1].usage

        results = await gather(3, ask)
    assert len(sim.requests) == 1
    ids = set()
    for i, (completion, usage) in enumerate(results):
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "verdict"
        assert json.loads(call.function.arguments) == sim.expected_output(f"s{i}", SCHEMA)
        assert call.id.startswith("call_")
        ids.add(call.id)
        assert usage is not None
    assert len(ids) == 3
    stats = sim.statistics()
    assert sum(u.prompt_tokens for _, u in results) == stats.prompt_tokens
    assert sum(u.completion_tokens for _, u in results) == stats.completion_tokens


@pytest.mark.anyio
async def test_parse_with_a_forced_pydantic_tool_gets_parsed_arguments() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    tool = openai.pydantic_function_tool(Verdict)
    schema = tool["function"]["parameters"]
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:
        replies = await gather(
            4,
            lambda i: client.chat.completions.parse(
                **chat(f"p{i}", tools=[tool], tool_choice="required")
            ),
        )
    assert len(sim.requests) == 1
    for i, reply in enumerate(replies):
        assert isinstance(reply, ParsedChatCompletion)
        (call,) = reply.choices[0].message.tool_calls or []
        expected = sim.expected_output(f"p{i}", schema)
        assert call.function.parsed_arguments == Verdict.model_validate(expected)
        assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "choice",
    [{"type": "any"}, {"type": "tool", "name": "verdict", "disable_parallel_tool_use": True}],
)
async def test_anthropic_forced_tool_callers_get_their_own_tool_use(choice: dict[str, Any]) -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.anthropic_client(max_retries=0), max_items=3, packing="always") as client:
        replies = await gather(
            6,
            lambda i: client.messages.create(
                **msg(f"a{i}", system="Classify.", tools=[ANTHROPIC_TOOL], tool_choice=choice)
            ),
        )
    assert [r.items for r in sim.requests] == [3, 3]
    ids = set()
    for i, reply in enumerate(replies):
        assert isinstance(reply, Message)
        (block,) = reply.content
        assert block.type == "tool_use"
        assert block.id.startswith("toolu_")
        assert (block.name, reply.stop_reason) == ("verdict", "tool_use")
        assert block.input == sim.expected_output(f"a{i}", SCHEMA)
        ids.add(block.id)
    assert len(ids) == 6
    stats = sim.statistics()
    assert sum(r.usage.input_tokens for r in replies) == stats.prompt_tokens
    assert sum(r.usage.output_tokens for r in replies) == stats.completion_tokens


@pytest.mark.anyio
async def test_streamed_anthropic_tool_use_accumulates_as_the_sdk_does() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.anthropic_client(max_retries=0), max_items=2, packing="always") as client:

        async def ask(i: int) -> Any:
            stream = await client.messages.create(
                **msg(f"z{i}", tools=[ANTHROPIC_TOOL], tool_choice={"type": "any"}, stream=True)
            )
            snapshot, bufs = None, dict[int, bytes]()
            async for event in stream:
                snapshot = accumulated(
                    accumulate_event, event=event, current_snapshot=snapshot, json_bufs=bufs
                )
            return snapshot

        messages = await gather(2, ask)
    assert len(sim.requests) == 1
    for i, message in enumerate(messages):
        assert message is not None
        (block,) = message.content
        assert block.type == "tool_use"
        assert block.input == sim.expected_output(f"z{i}", SCHEMA)
        assert message.stop_reason == "tool_use"
    assert messages[0].content[0].id != messages[1].content[0].id


class _Spy:
    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return await self.real(**kwargs)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [TOOL, SECOND], "tool_choice": "required"},
        {"tools": [TOOL], "tool_choice": "auto"},
        {"tools": [TOOL]},
    ],
)
async def test_openai_calls_with_tools_the_model_chooses_among_reach_the_real_client(
    extra: dict[str, Any],
) -> None:
    sim = SimulatedProvider(time_scale=0.01)
    raw = sim.openai_client(max_retries=0)
    spy = _Spy(raw.chat.completions.create)
    raw.chat.completions.create = spy  # type: ignore[method-assign]
    async with wrap(raw, max_items=4, packing="always") as client:
        kwargs = chat("hello", **extra)
        passed = await gather(2, lambda i: client.chat.completions.create(**kwargs))
    assert spy.calls == [kwargs, kwargs]
    assert all(isinstance(reply, ChatCompletion) for reply in passed)
    assert len(sim.requests) == 2


@pytest.mark.anyio
async def test_anthropic_calls_with_several_tools_reach_the_real_client() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    raw = sim.anthropic_client(max_retries=0)
    spy = _Spy(raw.messages.create)
    raw.messages.create = spy  # type: ignore[method-assign]
    async with wrap(raw, max_items=4, packing="always") as client:
        kwargs = msg("x", tools=[ANTHROPIC_TOOL, ANTHROPIC_SECOND], tool_choice={"type": "any"})
        passed = await gather(2, lambda i: client.messages.create(**kwargs))
    assert spy.calls == [kwargs, kwargs]
    assert all(isinstance(reply, Message) for reply in passed)
    assert len(sim.requests) == 2

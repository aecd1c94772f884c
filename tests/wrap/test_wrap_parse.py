"""``coalesce.wrap(client)``'s ``parse()``: the SDKs' structured-output helpers coalesce
like the ``create()`` call they send, and each caller gets the SDK's parsed object of its
own type. Pure reads first, then the official SDKs against the simulated provider."""

from __future__ import annotations

import json
from typing import Any, Literal, cast

import anthropic
import openai
import pydantic
import pytest
from _wrapping import chat, gather, msg
from anthropic.types import Message, ParsedMessage
from openai.lib._parsing._completions import type_to_response_format_param
from openai.types.chat import ChatCompletion, ParsedChatCompletion
from typing_extensions import assert_type

import coalesce
from coalesce._wrap import wrap
from coalesce._wrap.anthropic_messages import anthropic_create_call
from coalesce._wrap.anthropic_parse import anthropic_parse_call
from coalesce._wrap.openai_chat import openai_create_call
from coalesce._wrap.openai_parse import openai_parse_call
from coalesce.testing import SimulatedProvider


class Verdict(pydantic.BaseModel):
    label: Literal["spam", "ham"]
    score: int


class Topic(pydantic.BaseModel):
    topic: str
    tags: list[str]


def openai_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The schema the SDK's parse() sends for ``model``."""
    fmt: Any = type_to_response_format_param(model)
    return cast(dict[str, Any], fmt["json_schema"]["schema"])


def anthropic_format(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The ``output_config.format`` the SDK's parse() sends for ``model``."""
    schema = anthropic.transform_schema(pydantic.TypeAdapter(model).json_schema())
    return {"type": "json_schema", "schema": schema}


# -- pure reads -----------------------------------------------------------------------


def test_openai_parse_is_read_as_the_create_call_the_sdk_sends() -> None:
    parsed = openai_parse_call(chat("x", response_format=Verdict, temperature=0))
    created = openai_create_call(
        chat("x", response_format=type_to_response_format_param(Verdict), temperature=0)
    )
    assert parsed is not None
    assert parsed == created
    assert parsed.output_schema == openai_schema(Verdict)
    text = openai_parse_call(chat("x"))
    assert text is not None
    assert text.output_schema is None
    parts = [{"role": "user", "content": [{"type": "text", "text": "x"}]}]
    as_parts = openai_parse_call(chat("x", response_format=Verdict, temperature=0, messages=parts))
    assert as_parts is not None
    assert as_parts.item == "x"


def test_openai_parse_keys_differ_by_response_model() -> None:
    verdict, topic = (
        openai_parse_call(chat("x", response_format=Verdict)),
        openai_parse_call(chat("x", response_format=Topic)),
    )
    assert verdict is not None
    assert topic is not None
    assert verdict.key != topic.key


class NotAModel:
    pass


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [openai.pydantic_function_tool(Verdict)]},
        {"n": 2},
        {"stream": True},
        {"stream": False},  # parse() takes no stream=: the SDK refuses it itself
        {"stream_options": {"include_usage": True}},
        {"logprobs": True},
        {"response_format": NotAModel},  # the SDK cannot convert it: its own error
        # Text parts coalesce (tests/wrap/test_wrap_arguments.py); other parts do not.
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"tools": [openai.pydantic_function_tool(Topic)], "tool_choice": "required"},
    ],
)
def test_openai_parse_passthrough(extra: dict[str, Any]) -> None:
    assert openai_parse_call({**chat("x", response_format=Verdict), **extra}) is None


def test_anthropic_parse_is_read_as_create_with_output_config() -> None:
    parsed = anthropic_parse_call(msg("x", output_format=Verdict, temperature=0))
    created = anthropic_create_call(
        msg("x", output_config={"format": anthropic_format(Verdict)}, temperature=0)
    )
    assert parsed is not None
    assert parsed == created
    assert (parsed.output_schema, parsed.tool) == (anthropic_format(Verdict)["schema"], None)
    topic = anthropic_parse_call(msg("x", output_format=Topic))
    assert topic is not None
    assert topic.key != parsed.key
    text = anthropic_parse_call(msg("x", output_format=None))
    assert text == anthropic_create_call(msg("x"))


@pytest.mark.parametrize(
    "extra",
    [
        {"output_config": {"effort": "low"}},
        {"stream": True},
        {"output_format": {"type": "object"}},  # a dict: the SDK refuses it itself
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {
            "tools": [{"name": "out", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "out"},
        },
    ],
)
def test_anthropic_parse_passthrough(extra: dict[str, Any]) -> None:
    assert anthropic_parse_call({**msg("x", output_format=Verdict), **extra}) is None


@pytest.mark.parametrize(
    "output_config",
    [
        {"effort": "low"},
        {"format": anthropic_format(Verdict), "effort": "low"},
        {"format": {"type": "json_schema"}},
        {"format": {"type": "text"}},
    ],
)
def test_anthropic_create_coalesces_output_config_of_one_json_schema_only(
    output_config: dict[str, Any],
) -> None:
    assert anthropic_create_call(msg("x", output_config={"format": anthropic_format(Verdict)}))
    assert anthropic_create_call(msg("x", output_config=output_config)) is None


# -- against the simulated provider ---------------------------------------------------


def assert_parsed(
    sim: SimulatedProvider, reply: ParsedChatCompletion[Any], item: str, model: type[Any]
) -> None:
    """``reply`` is the SDK's parsed object of ``model``, with ``item``'s own answer."""
    assert isinstance(reply, ParsedChatCompletion)
    message = reply.choices[0].message
    expected = sim.expected_output(item, openai_schema(model))
    assert isinstance(message.parsed, model)
    assert message.parsed == model.model_validate(expected)
    assert json.loads(message.content or "") == expected
    assert (reply.choices[0].finish_reason, message.refusal) == ("stop", None)


@pytest.mark.anyio
async def test_concurrent_parse_calls_coalesce_each_with_its_own_parsed_answer() -> None:
    sim = SimulatedProvider()
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:

        async def ask(i: int) -> ParsedChatCompletion[Verdict]:
            reply = await client.chat.completions.parse(
                model="gpt-4o-mini",
                messages=[
                    {"role": "system", "content": "Classify."},
                    {"role": "user", "content": f"m{i}"},
                ],
                response_format=Verdict,
                seed=openai.omit,  # the SDK's "not given" still coalesces
            )
            assert_type(reply, ParsedChatCompletion[Verdict])  # the SDK's own types
            assert_type(reply.choices[0].message.parsed, Verdict | None)
            return reply

        replies = await gather(8, ask)
    assert len(sim.requests) == 2
    assert [r.items for r in sim.requests] == [4, 4]
    for i, reply in enumerate(replies):
        assert_parsed(sim, reply, f"m{i}", Verdict)
    assert len({r.id for r in replies}) == 8
    stats = sim.statistics()
    usages = [r.usage for r in replies if r.usage is not None]
    assert sum(u.prompt_tokens for u in usages) == stats.prompt_tokens
    assert sum(u.completion_tokens for u in usages) == stats.completion_tokens


@pytest.mark.anyio
async def test_beta_parse_coalesces_alike() -> None:
    sim = SimulatedProvider()
    raw = sim.openai_client(max_retries=0)
    async with wrap(raw, max_items=4, packing="always") as client:
        replies = await gather(
            4,
            lambda i: client.beta.chat.completions.parse(**chat(f"b{i}", response_format=Verdict)),
        )
        assert client.beta.chat.completions.with_raw_response is not None  # the SDK's own
        assert client.beta.assistants is raw.beta.assistants
    assert len(sim.requests) == 1
    for i, reply in enumerate(replies):
        assert_parsed(sim, reply, f"b{i}", Verdict)


@pytest.mark.anyio
async def test_two_response_models_are_never_packed_together() -> None:
    sim = SimulatedProvider()
    async with wrap(sim.openai_client(max_retries=0), max_items=8, packing="always") as client:

        async def ask(i: int) -> ParsedChatCompletion[Any]:
            model: type[pydantic.BaseModel] = Verdict if i % 2 else Topic
            return await client.chat.completions.parse(**chat(f"q{i}", response_format=model))

        replies = await gather(8, ask)
    # Together they would have filled one request of eight.
    assert sorted(r.items for r in sim.requests) == [4, 4]
    for i, reply in enumerate(replies):
        assert_parsed(sim, reply, f"q{i}", Verdict if i % 2 else Topic)


@pytest.mark.anyio
async def test_parse_shares_requests_with_the_equivalent_create() -> None:
    sim = SimulatedProvider()
    rf = type_to_response_format_param(Verdict)
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:

        async def ask(i: int) -> ChatCompletion:
            if i % 2:
                return await client.chat.completions.parse(**chat(f"s{i}", response_format=Verdict))
            created: ChatCompletion = await client.chat.completions.create(
                **chat(f"s{i}", response_format=rf)
            )
            return created

        replies = await gather(4, ask)
    assert len(sim.requests) == 1
    for i, reply in enumerate(replies):
        if i % 2:
            assert isinstance(reply, ParsedChatCompletion)
            assert_parsed(sim, reply, f"s{i}", Verdict)
        else:
            assert not isinstance(reply, ParsedChatCompletion)
            content = reply.choices[0].message.content or ""
            assert json.loads(content) == sim.expected_output(f"s{i}", openai_schema(Verdict))


@pytest.mark.anyio
async def test_parse_without_response_format_is_text() -> None:
    sim = SimulatedProvider()
    async with wrap(sim.openai_client(max_retries=0), max_items=3, packing="always") as client:
        replies = await gather(3, lambda i: client.chat.completions.parse(**chat(f"t{i}")))
    assert len(sim.requests) == 1
    for i, reply in enumerate(replies):
        assert isinstance(reply, ParsedChatCompletion)
        assert reply.choices[0].message.parsed is None
        assert reply.choices[0].message.content == sim.expected_output(f"t{i}")


@pytest.mark.anyio
async def test_a_reply_cut_off_raises_the_sdks_length_error() -> None:
    sim = SimulatedProvider()
    sim.inject("truncate")
    raw = sim.openai_client(max_retries=0)
    async with wrap(raw, max_attempts=1, max_wait=0.0, packing="always") as client:
        with pytest.raises(openai.LengthFinishReasonError) as caught:
            await client.chat.completions.parse(**chat("long", response_format=Verdict))
    assert isinstance(caught.value.__cause__, coalesce.TruncatedOutputError)
    choice = caught.value.completion.choices[0]
    assert (choice.finish_reason, caught.value.completion.model) == ("length", "gpt-4o-mini")
    assert sim.requests[0].faults == ("truncate",)


class _Spy:
    def __init__(self, real: Any, reply: Any = None) -> None:
        self.real = real
        self.reply = reply
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return self.reply if self.real is None else await self.real(**kwargs)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("extra", "sent"),
    [
        ({"tools": [openai.pydantic_function_tool(Topic)]}, None),
        ({"n": 2}, None),
        ({"extra_headers": {"x-coalesce": "off"}}, {}),
        (
            {"extra_headers": {"x-coalesce": "off", "x-mine": "1"}},
            {"extra_headers": {"x-mine": "1"}},
        ),
    ],
)
async def test_openai_parse_passthrough_reaches_the_real_parse(
    extra: dict[str, Any], sent: dict[str, Any] | None
) -> None:
    sim = SimulatedProvider()
    raw = sim.openai_client(max_retries=0)
    spy = _Spy(raw.chat.completions.parse)
    raw.chat.completions.parse = spy  # type: ignore[method-assign]
    async with wrap(raw, packing="always") as client:
        reply = await client.chat.completions.parse(
            **chat("hello", response_format=Verdict, **extra)
        )
    expected = chat("hello", response_format=Verdict, **(extra if sent is None else sent))
    assert spy.calls == [expected]
    assert isinstance(reply, ParsedChatCompletion)
    assert len(sim.requests) == 1


@pytest.mark.anyio
async def test_parse_with_stream_gets_the_sdks_own_error() -> None:
    sim = SimulatedProvider()
    raw = sim.openai_client(max_retries=0)
    spy = _Spy(raw.chat.completions.parse)
    raw.chat.completions.parse = spy  # type: ignore[method-assign]
    async with wrap(raw, packing="always") as client:
        with pytest.raises(TypeError, match="stream"):
            await client.chat.completions.parse(**chat("x", response_format=Verdict, stream=True))
    assert len(spy.calls) == 1
    assert len(sim.requests) == 0


@pytest.mark.anyio
async def test_anthropic_parse_coalesces_with_equivalent_creates() -> None:
    sim = SimulatedProvider()
    fmt = anthropic_format(Verdict)
    async with wrap(sim.anthropic_client(max_retries=0), max_items=6, packing="always") as client:

        async def ask(i: int) -> Message:
            if i % 2:
                created: Message = await client.messages.create(
                    **msg(f"a{i}", output_config={"format": fmt})
                )
                return created
            reply = await client.messages.parse(**msg(f"a{i}"), output_format=Verdict)
            assert_type(reply, ParsedMessage[Verdict])
            return reply

        replies = await gather(6, ask)
    assert len(sim.requests) == 1
    for i, reply in enumerate(replies):
        expected = sim.expected_output(f"a{i}", fmt["schema"])
        block = reply.content[0]
        assert block.type == "text"
        assert json.loads(block.text) == expected
        assert reply.stop_reason == "end_turn"
        if i % 2:
            assert not isinstance(reply, ParsedMessage)
        else:
            assert isinstance(reply, ParsedMessage)
            assert isinstance(reply.parsed_output, Verdict)
            assert reply.parsed_output == Verdict.model_validate(expected)
    stats = sim.statistics()
    assert sum(r.usage.input_tokens for r in replies) == stats.prompt_tokens
    assert sum(r.usage.output_tokens for r in replies) == stats.completion_tokens


@pytest.mark.anyio
async def test_anthropic_parse_passthrough_reaches_the_real_parse() -> None:
    sim = SimulatedProvider()
    raw = sim.anthropic_client(max_retries=0)
    spy = _Spy(None, reply="the SDK's own")
    raw.messages.parse = spy  # type: ignore[method-assign]
    async with wrap(raw, max_items=4, packing="always") as client:
        kwargs = msg("x", output_format=Verdict, stop_sequences=["\n\n"])
        passed: Any = await client.messages.parse(**kwargs)
        assert passed == "the SDK's own"
        cut = await gather(2, lambda i: client.messages.parse(**msg(f"y{i}", output_format=Topic)))
    assert spy.calls == [kwargs]
    assert len(sim.requests) == 1  # the two coalesced calls, not the spy's
    assert all(isinstance(r.parsed_output, Topic) for r in cut)

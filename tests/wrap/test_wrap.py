"""``coalesce.wrap(client, packing="always")``: pure compatibility and usage decisions, then the wrapped
official SDK clients against the simulated provider, in process (virtual time) and
over real HTTP."""

from __future__ import annotations

import json
from typing import Any, cast

import anthropic
import anyio
import openai
import pytest
from _wrapping import SCHEMA, SYSTEM, TEXT, chat, gather, msg
from anthropic.types import Message
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import coalesce
from coalesce._observe.listeners import apportion, split_usage
from coalesce._wrap import wrap
from coalesce._wrap.anthropic_messages import anthropic_create_call
from coalesce._wrap.headers import HEADERS, CallHeaders, coalesce_headers
from coalesce._wrap.openai_chat import openai_create_call
from coalesce._wrap.registry import TRANSLATORS
from coalesce.testing import FaultPlan, SimulatedProvider

# -- pure decisions -------------------------------------------------------------------


def test_openai_create_call_item_and_key() -> None:
    a, b = openai_create_call(chat("hello")), openai_create_call(chat("bye"))
    assert a is not None
    assert b is not None
    assert (a.item, b.item) == ("hello", "bye")
    assert a.key == b.key
    assert "Answer briefly." in a.instructions
    assert a.output_schema is None


@pytest.mark.parametrize(
    "changed",
    [
        {"model": "gpt-4o"},
        {"temperature": 0.3},
        {"messages": [{"role": "system", "content": "Other."}, {"role": "user", "content": "x"}]},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": SCHEMA},
            }
        },
        {"max_tokens": 10},
    ],
)
def test_openai_key_separates(changed: dict[str, Any]) -> None:
    base, other = openai_create_call(chat("x")), openai_create_call({**chat("x"), **changed})
    assert base is not None
    assert other is not None
    assert base.key != other.key


def test_earlier_turns_go_into_the_instructions() -> None:
    messages = [
        SYSTEM,
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
    ]
    call = openai_create_call({"model": "m", "messages": messages})
    assert call is not None
    assert call.item == "What is my name?"
    assert "[user] My name is Ada." in call.instructions
    assert "[assistant] Hello Ada." in call.instructions


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"tool_choice": "auto"},
        {"n": 2},
        {"stream_options": {"include_usage": True}},  # without stream=True: the SDK's call
        {"stream": True, "stream_options": {"include_obfuscation": False}},
        {"stream": "yes"},
        {"logprobs": True},
        {"stop": ["\n"]},
        {  # a forced tool and a reply format: which is the answer?
            "response_format": {"type": "json_object"},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}],
            "tool_choice": "required",
        },
        {"response_format": {"type": "json_object", "other": 1}},
        {"max_tokens": 0},
        {"extra_body": {"x": 1}},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
                    ],
                }
            ]
        },
        {"messages": [SYSTEM, {"role": "assistant", "content": "last"}]},
        {
            "messages": [
                {"role": "tool", "content": "r", "tool_call_id": "1"},
                {"role": "user", "content": "x"},
            ]
        },
        {"messages": []},
    ],
)
def test_openai_passthrough(extra: dict[str, Any]) -> None:
    assert openai_create_call({**chat("x"), **extra}) is None


def test_streamed_calls_coalesce_among_themselves() -> None:
    plain = openai_create_call(chat("x"))
    streamed = openai_create_call(chat("x", stream=True, stream_options={"include_usage": True}))
    assert plain is not None
    assert streamed is not None
    assert (streamed.stream, streamed.include_usage) == (True, True)
    assert streamed.key != plain.key
    unstreamed = openai_create_call(chat("x", stream=False))
    assert unstreamed is not None
    assert unstreamed.key == plain.key
    told = anthropic_create_call(msg("x", stream=True))
    assert told is not None
    assert told.stream


def test_openai_json_schema_is_the_output_schema() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    call = openai_create_call(chat("x", response_format=rf, n=1, temperature=0))
    assert call is not None
    assert call.output_schema == SCHEMA
    assert call.options == {"temperature": 0}


def test_anthropic_create_call() -> None:
    call = anthropic_create_call(
        msg("hi", system=[{"type": "text", "text": "Be kind."}], temperature=0)
    )
    assert call is not None
    assert (call.item, call.item_cap, call.tool) == ("hi", 200, None)
    assert call.instructions.startswith("Be kind.")
    forced = anthropic_create_call(
        msg(
            "hi",
            tools=[{"name": "out", "input_schema": SCHEMA}],
            tool_choice={"type": "tool", "name": "out"},
        )
    )
    assert forced is not None
    assert (forced.tool, forced.output_schema) == ("out", SCHEMA)


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"name": "out", "input_schema": SCHEMA}]},
        {"tools": [{"name": "out", "input_schema": SCHEMA}], "tool_choice": {"type": "auto"}},
        {
            "tools": [{"name": "a", "input_schema": SCHEMA}],
            "tool_choice": {"type": "tool", "name": "b"},
        },
        {"stream": 1},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"stop_sequences": ["x"]},
        {"system": [{"type": "image"}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    ],
)
def test_anthropic_passthrough(extra: dict[str, Any]) -> None:
    assert anthropic_create_call({**msg("x"), **extra}) is None


def test_coalesce_headers_strip_coalesce_headers() -> None:
    kwargs = {"model": "m", "extra_headers": {"X-Coalesce-Budget": "0.5", "x-other": "1"}}
    cleaned, headers = coalesce_headers(kwargs)
    assert cleaned == {"model": "m", "extra_headers": {"x-other": "1"}}
    assert headers == CallHeaders(coalesce=True, budget=0.5, partition=None)
    cleaned, headers = coalesce_headers({"model": "m", "extra_headers": {"x-coalesce": "OFF"}})
    assert (cleaned, headers) == ({"model": "m"}, CallHeaders(coalesce=False))
    cleaned, headers = coalesce_headers(
        {"model": "m", "extra_headers": {"x-coalesce": " on ", "x-coalesce-partition": "t1"}}
    )
    assert (cleaned, headers) == ({"model": "m"}, CallHeaders(partition="t1"))
    assert coalesce_headers({"model": "m"}) == ({"model": "m"}, CallHeaders())
    # Not ours: left in place, untouched.
    mine = {"model": "m", "extra_headers": {"x-coalescence": "1"}}
    assert coalesce_headers(mine) == (mine, CallHeaders())
    assert coalesce_headers({"extra_headers": {"x-coalesce-budget": 2}})[1].budget == 2.0
    omitted = {"x-coalesce-budget": openai.omit}
    assert coalesce_headers({"extra_headers": omitted}) == ({}, CallHeaders())


@pytest.mark.parametrize(
    ("headers", "named", "valid"),
    [
        ({"x-coalesce-budget": "abc"}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce-budget": "-1"}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce-budget": "0"}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce-budget": "nan"}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce-budget": "inf"}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce-budget": ""}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce-budget": True}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce-budget": [1]}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce-budget": 10**400}, "x-coalesce-budget", "positive, finite number"),
        ({"x-coalesce": "no"}, "x-coalesce", "'on' or 'off'"),
        ({"x-coalesce": False}, "x-coalesce", "'on' or 'off'"),
        ({"x-coalesce-partition": ""}, "x-coalesce-partition", "non-empty string"),
        ({"x-coalesce-partition": 7}, "x-coalesce-partition", "non-empty string"),
        ({"x-coalesce-budjet": "1"}, "x-coalesce-budjet", "x-coalesce-budget"),
        ({"x-coalesce-budget": "1", "X-Coalesce-Budget": "2"}, "given twice", "give it once"),
    ],
)
def test_invalid_coalesce_headers_name_the_header_the_value_and_what_is_valid(
    headers: dict[str, Any], named: str, valid: str
) -> None:
    with pytest.raises(coalesce.ConfigurationError) as caught:
        coalesce_headers({"model": "m", "extra_headers": headers})
    message = str(caught.value)
    assert named in message
    assert valid in message
    if named in HEADERS:  # a known header: its value is shown too
        assert repr(next(iter(headers.values()))) in message


def test_apportion_sums_exactly() -> None:
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]
    assert apportion(7, [0, 0]) == [4, 3]
    assert apportion(0, [5, 1]) == [0, 0]
    assert apportion(5, []) == []
    assert sum(apportion(1001, [3, 7, 11, 13])) == 1001


def test_split_usage_shares_the_common_prompt() -> None:
    parts = split_usage(100, 30, own_inputs=[10, 30], own_outputs=[5, 0])
    assert sum(p for p, _ in parts) == 100
    assert sum(c for _, c in parts) == 30
    # Shared part 60 split evenly: 30 + 10 and 30 + 30.
    assert [p for p, _ in parts] == [40, 60]
    assert parts[0][1] > parts[1][1]


def test_wrap_rejects_other_clients() -> None:
    # The message names what wrap takes (the sync clients too), and nothing it refuses.
    for other in (object(), lambda request: "answer"):
        with pytest.raises(coalesce.ConfigurationError) as info:
            wrap(other, packing="always")
        message = str(info.value)
        assert "openai.OpenAI" in message
        assert "anthropic.Anthropic" in message
        assert "callable" not in message
        assert "@coalesce.prompt(client=" in message
    raw = SimulatedProvider().openai_client()
    with pytest.raises(coalesce.ConfigurationError, match=r"already wrapped by coalesce\.wrap"):
        wrap(wrap(raw, packing="always"), packing="always")


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_the_registry_names_every_method_wrap_intercepts(sdk: str) -> None:
    sim = SimulatedProvider()
    raw: Any = sim.openai_client() if sdk == "openai" else sim.anthropic_client()
    client: Any = wrap(raw, packing="always")
    for path in TRANSLATORS[sdk]:
        ours, theirs = client, raw
        for name in path.split("."):
            ours, theirs = getattr(ours, name), getattr(theirs, name)
        assert ours != theirs, path  # a coalescing method in place of the SDK's
    resource = "chat.completions" if sdk == "openai" else "messages"
    ours, theirs = client, raw
    for name in resource.split("."):
        ours, theirs = getattr(ours, name), getattr(theirs, name)
    # The SDK's own raw-response wrappers, built around the coalescing methods.
    assert type(ours.with_raw_response) is type(theirs.with_raw_response)
    assert ours.with_raw_response.create.__wrapped__ is ours.create
    assert client.models is raw.models  # not in the table: the SDK's own


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"timeout": 0}, "timeout must be a finite number of seconds > 0 or None, got 0"),
        ({"timeout": "5"}, "timeout must be a finite number of seconds > 0 or None, got '5'"),
        ({"context_window": 0}, "context_window must be an integer >= 1 or None, got 0"),
        ({"schema_enforced": "yes"}, "schema_enforced must be True, False or None, got 'yes'"),
        ({"partition": "user"}, "partition must be a callable or None, got 'user'"),
        ({"max_items": 0}, "max_items must be an integer >= 1, got 0"),
    ],
)
def test_wrap_refuses_bad_options_at_once(option: dict[str, Any], message: str) -> None:
    raw = SimulatedProvider().openai_client()
    with pytest.raises(coalesce.ConfigurationError) as caught:
        wrap(raw, **option, packing="always")
    assert str(caught.value) == message


def test_a_misspelt_option_fails_at_wrap_time_naming_it() -> None:
    raw = SimulatedProvider().openai_client()
    with pytest.raises(TypeError, match="max_item"):
        wrap(raw, **cast(Any, {"max_item": 8}), packing="always")


@pytest.mark.anyio
async def test_timeout_context_window_and_schema_enforcement_reach_the_engine() -> None:
    sim = SimulatedProvider()
    raw = sim.anthropic_client(max_retries=0)
    async with wrap(
        raw,
        max_wait=0.0,
        timeout=7.5,
        context_window=50_000,
        schema_enforced=True,
        packing="always",
    ) as client:
        await client.messages.create(**msg("x"))
        call = anthropic_create_call(msg("x"))
        assert call is not None
        engine = cast(Any, client)._engines.engine(call)
    chosen = engine.options
    assert (chosen.timeout, chosen.context_window, chosen.schema_enforced) == (7.5, 50_000, True)


@pytest.mark.anyio
async def test_timeout_frees_the_callers_of_a_provider_that_never_answers() -> None:
    sim = SimulatedProvider()
    sim.inject("hang")
    async with wrap(
        sim.openai_client(), max_wait=0.0, max_retries=0, timeout=2.0, packing="always"
    ) as client:
        start = anyio.current_time()
        with pytest.raises(coalesce.RequestTimeoutError, match="2 s timeout"):
            await client.chat.completions.create(**chat("x"))
        assert 2.0 <= anyio.current_time() - start < 2.1


# -- in process, virtual time ---------------------------------------------------------


@pytest.mark.anyio
async def test_openai_typed_own_answers_and_usage() -> None:
    sim = SimulatedProvider()
    async with wrap(sim.openai_client(max_retries=0), max_items=5, packing="always") as client:
        replies = await gather(12, lambda i: client.chat.completions.create(**chat(f"q{i}")))
    assert len(sim.requests) == 3
    for i, reply in enumerate(replies):
        assert isinstance(reply, ChatCompletion)
        assert reply.choices[0].message.content == sim.expected_output(f"q{i}", TEXT)
        assert reply.choices[0].finish_reason == "stop"
        assert reply.id.startswith("chatcmpl-")
        assert reply.model == "gpt-4o-mini"
        assert reply.usage is not None
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    stats = sim.statistics()
    assert sum(r.usage.prompt_tokens for r in replies) == stats.prompt_tokens
    assert sum(r.usage.completion_tokens for r in replies) == stats.completion_tokens
    assert len({r.id for r in replies}) == 12


@pytest.mark.anyio
async def test_openai_json_schema() -> None:
    sim = SimulatedProvider()
    rf = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:
        # An explicit stream=False and the SDK's "not given" sentinel still coalesce.
        replies = await gather(
            8,
            lambda i: client.chat.completions.create(
                **chat(f"mail {i}", response_format=rf, stream=False, seed=openai.NOT_GIVEN)
            ),
        )
    assert len(sim.requests) == 2
    for i, reply in enumerate(replies):
        content = reply.choices[0].message.content
        assert ChatCompletion.model_validate(reply.model_dump()) == reply
        assert content is not None
        assert json.loads(content) == sim.expected_output(f"mail {i}", SCHEMA)


@pytest.mark.anyio
async def test_a_lone_structured_call_is_sent_plain_and_charged_in_full() -> None:
    sim = SimulatedProvider()
    rf = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
    async with wrap(sim.openai_client(max_retries=0), max_wait=0.0, packing="always") as client:
        reply = await client.chat.completions.create(**chat("mail 1", response_format=rf))
        stats = cast(coalesce.CoalescedClient, client).statistics()["gpt-4o-mini"]
    assert json.loads(reply.choices[0].message.content or "") == sim.expected_output(
        "mail 1", SCHEMA
    )
    (record,) = sim.requests
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
    assert stats.savings == 0.0  # what the plain call would have cost


@pytest.mark.anyio
async def test_anthropic_text_and_forced_tool() -> None:
    sim = SimulatedProvider()
    tool = {
        "tools": [{"name": "verdict", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "verdict"},
    }
    async with wrap(sim.anthropic_client(max_retries=0), max_items=6, packing="always") as client:
        texts = await gather(
            6, lambda i: client.messages.create(**msg(f"t{i}", system="Be brief."))
        )
        tools = await gather(6, lambda i: client.messages.create(**msg(f"t{i}", **tool)))
    assert len(sim.requests) == 2
    for i, (text, used) in enumerate(zip(texts, tools, strict=True)):
        assert isinstance(text, Message)
        assert isinstance(used, Message)
        assert text.content[0].type == "text"
        assert text.content[0].text == sim.expected_output(f"t{i}", TEXT)
        assert text.stop_reason == "end_turn"
        assert used.content[0].type == "tool_use"
        assert used.content[0].name == "verdict"
        assert used.content[0].input == sim.expected_output(f"t{i}", SCHEMA)
        assert used.stop_reason == "tool_use"
        assert text.id.startswith("msg_")
    stats = sim.statistics()
    everyone = texts + tools
    assert sum(m.usage.input_tokens for m in everyone) == stats.prompt_tokens
    assert sum(m.usage.output_tokens for m in everyone) == stats.completion_tokens


class _Spy:
    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return await self.real(**kwargs)


TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("extra", "sent"),
    [
        ({"tools": TOOLS}, {"tools": TOOLS}),
        ({"n": 2}, {"n": 2}),
        ({"extra_headers": {"x-coalesce": "off"}}, {}),
        (
            {"extra_headers": {"x-coalesce": "off", "x-mine": "1"}},
            {"extra_headers": {"x-mine": "1"}},
        ),
    ],
)
async def test_openai_passthrough_reaches_the_real_client(
    extra: dict[str, Any], sent: dict[str, Any]
) -> None:
    sim = SimulatedProvider()
    raw = sim.openai_client(max_retries=0)
    spy = _Spy(raw.chat.completions.create)
    raw.chat.completions.create = spy  # type: ignore[method-assign]
    async with wrap(raw, packing="always") as client:
        reply = await client.chat.completions.create(**chat("hello", **extra))
    assert spy.calls == [chat("hello", **sent)]
    assert isinstance(reply, ChatCompletion)
    assert len(sim.requests) == 1


@pytest.mark.anyio
async def test_anthropic_passthrough_and_other_attributes() -> None:
    sim = SimulatedProvider()
    raw = sim.anthropic_client(max_retries=0)
    spy = _Spy(raw.messages.create)
    raw.messages.create = spy  # type: ignore[method-assign]
    async with wrap(raw, packing="always") as client:
        assert client.base_url == raw.base_url
        assert client.messages.with_raw_response is not None
        kwargs = msg("x", stop_sequences=["\n\n"])
        reply = await client.messages.create(**kwargs)
        coalesced = await client.messages.create(**msg("y"))
    assert spy.calls == [kwargs]
    assert isinstance(reply, Message)
    assert isinstance(coalesced, Message)


@pytest.mark.anyio
async def test_budget_header_and_context_manager() -> None:
    sim = SimulatedProvider()
    kwargs: dict[str, Any] = {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}
    async with wrap(
        sim.openai_client(max_retries=0), max_wait=5.0, latency_budget=30.0, packing="always"
    ) as client:

        async def took(**extra: Any) -> float:
            start = anyio.current_time()
            reply = await client.chat.completions.create(**kwargs, **extra)
            assert reply.choices[0].message.content == sim.expected_output("x", TEXT)
            return anyio.current_time() - start

        assert await took() > 5.0  # a lone call waits out max_wait for company
        # A 3 s budget (the provider answers in about 0.5 s) cuts the wait short.
        assert await took(extra_headers={"x-coalesce-budget": "3"}) <= 3.0
        with coalesce.latency_budget(3):
            assert await took() <= 3.0
    assert len(sim.requests) == 3


@pytest.mark.anyio
async def test_sdk_exceptions_reach_the_callers() -> None:
    sim = SimulatedProvider()
    sim.inject("server_error")
    async with wrap(sim.openai_client(max_retries=0), max_items=3, packing="always") as client:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(**chat("x"))
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(**{**chat("x"), "model": ""})
    sim.inject("rate_limit")
    async with wrap(sim.anthropic_client(max_retries=0), packing="always") as aclient:
        with pytest.raises(anthropic.RateLimitError):
            await aclient.messages.create(**msg("x"))


@pytest.mark.anyio
async def test_sdk_retries_become_coalesce_retries() -> None:
    sim = SimulatedProvider()
    sim.inject("server_error", "unavailable")
    async with wrap(sim.openai_client(max_retries=2), packing="always") as client:
        reply = await client.chat.completions.create(**chat("x"))
    assert reply.choices[0].message.content == sim.expected_output("x", TEXT)
    assert len(sim.requests) == 3


@pytest.mark.anyio
async def test_300_concurrent_calls_make_at_most_30_requests() -> None:
    sim = SimulatedProvider()
    async with wrap(sim.openai_client(max_retries=0), max_items=20, packing="always") as client:
        replies = await gather(300, lambda i: client.chat.completions.create(**chat(f"item {i}")))
    assert len(sim.requests) <= 30
    assert [r.choices[0].message.content for r in replies] == [
        sim.expected_output(f"item {i}", TEXT) for i in range(300)
    ]


async def settle_all(n: int, call: Any) -> list[Any]:
    """Like :func:`gather`, with each caller's exception in its place."""

    async def guarded(i: int) -> Any:
        try:
            return await call(i)
        except Exception as exc:
            return exc

    return await gather(n, guarded)


def assert_none_wrong(sim: SimulatedProvider, answers: list[Any]) -> None:
    """Faults were injected, and caller ``i`` got ``n{i}``'s answer or an ItemError."""
    assert sim.statistics().faults > 0
    wrong = [
        i
        for i, answer in enumerate(answers)
        if not isinstance(answer, coalesce.ItemError)
        and answer != sim.expected_output(f"n{i}", TEXT)
    ]
    assert wrong == []


@pytest.mark.anyio
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_injected_faults_never_give_a_wrong_answer(sdk: str) -> None:
    chances = {"missing_item": 0.1, "duplicate_id": 0.1, "out_of_order": 0.1, "truncate": 0.2}
    sim = SimulatedProvider(faults=FaultPlan(probabilities=chances, seed=5))
    if sdk == "openai":
        client: Any = wrap(sim.openai_client(max_retries=0), max_items=20, packing="always")
        replies = await settle_all(200, lambda i: client.chat.completions.create(**chat(f"n{i}")))
        answers = [r if isinstance(r, Exception) else r.choices[0].message.content for r in replies]
    else:
        client = wrap(sim.anthropic_client(max_retries=0), max_items=20, packing="always")
        replies = await settle_all(200, lambda i: client.messages.create(**msg(f"n{i}")))
        answers = [r if isinstance(r, Exception) else r.content[0].text for r in replies]
    await client.aclose()
    assert_none_wrong(sim, answers)
    # A re-asked item meets the same odds again: rarely, one runs out of attempts.
    assert sum(isinstance(a, Exception) for a in answers) <= 2


@pytest.mark.anyio
async def test_injected_faults_never_give_a_streaming_caller_a_wrong_answer() -> None:
    chances = {"missing_item": 0.1, "out_of_order": 0.1, "truncate": 0.1, "disconnect": 0.1}
    sim = SimulatedProvider(faults=FaultPlan(probabilities=chances, seed=7))
    client = wrap(sim.openai_client(max_retries=2), max_items=20, packing="always")

    async def one(i: int) -> str:
        stream = await client.chat.completions.create(**chat(f"n{i}", stream=True))
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    answers = await settle_all(200, one)
    await client.close()
    assert_none_wrong(sim, answers)
    assert sum(isinstance(a, Exception) for a in answers) <= 2


# -- over real HTTP -------------------------------------------------------------------


class TestOverHTTP:
    @pytest.fixture
    def anyio_backend(self, real_time_backend: Any) -> Any:
        return real_time_backend

    @pytest.mark.anyio
    async def test_openai(self) -> None:
        sim = SimulatedProvider(time_scale=0.001)
        async with sim.serve_async() as url:
            raw = sim.openai_client(url, max_retries=0)
            async with wrap(raw, max_items=20, max_wait=0.05, packing="always") as client:
                replies = await gather(
                    60, lambda i: client.chat.completions.create(**chat(f"h{i}"))
                )
                passed = await client.chat.completions.create(**chat("p", n=2))
                sim.inject("server_error")
                with pytest.raises(openai.InternalServerError):
                    await client.chat.completions.create(**chat("boom"))
        assert all(isinstance(r, ChatCompletion) for r in replies)
        assert [r.choices[0].message.content for r in replies] == [
            sim.expected_output(f"h{i}", TEXT) for i in range(60)
        ]
        assert isinstance(passed, ChatCompletion)
        coalesced = [r for r in sim.requests if r.items > 1]
        assert sum(r.items for r in coalesced) <= 60
        assert sum(x.usage.prompt_tokens for x in replies) == sum(
            r.prompt_tokens for r in coalesced
        )

    @pytest.mark.anyio
    async def test_anthropic(self) -> None:
        sim = SimulatedProvider(time_scale=0.001)
        async with (
            sim.serve_async() as url,
            wrap(
                sim.anthropic_client(url, max_retries=0), max_items=10, packing="always"
            ) as client,
        ):
            replies = await gather(20, lambda i: client.messages.create(**msg(f"a{i}")))

            async def streamed(i: int) -> str:
                stream = await client.messages.create(**msg(f"s{i}", stream=True))
                events = [event async for event in stream]
                assert isinstance(events[0], anthropic.types.RawMessageStartEvent)
                return "".join(e.delta.text for e in events if e.type == "content_block_delta")

            texts = await gather(10, streamed)
            sim.inject("rate_limit")
            with pytest.raises(anthropic.RateLimitError):
                await client.messages.create(**msg("boom"))
        assert [r.content[0].text for r in replies] == [
            sim.expected_output(f"a{i}", TEXT) for i in range(20)
        ]
        assert all(isinstance(r, Message) for r in replies)
        assert texts == [sim.expected_output(f"s{i}", TEXT) for i in range(10)]

    @pytest.mark.anyio
    async def test_openai_streaming(self) -> None:
        sim = SimulatedProvider(time_scale=0.001)
        async with sim.serve_async() as url:
            raw = sim.openai_client(url, max_retries=0)
            async with wrap(raw, max_items=10, max_wait=0.05, packing="always") as client:

                async def one(i: int) -> str:
                    stream = await client.chat.completions.create(**chat(f"s{i}", stream=True))
                    chunks = [c async for c in stream]
                    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
                    return "".join(c.choices[0].delta.content or "" for c in chunks)

                texts = await gather(40, one)
        assert texts == [sim.expected_output(f"s{i}", TEXT) for i in range(40)]
        assert len(sim.requests) <= 8


# -- streaming callers ----------------------------------------------------------------


@pytest.mark.anyio
async def test_openai_streaming_callers_get_their_own_chunks_before_the_reply_ends() -> None:
    sim = SimulatedProvider()
    opened: dict[int, float] = {}
    # The simulator holds replies to the schema; a server not known to do so gets its
    # streamed answers held until the reply can no longer contradict them.
    raw = sim.openai_client(max_retries=0)
    async with wrap(raw, max_items=6, schema_enforced=True, packing="always") as client:

        async def one(i: int) -> list[ChatCompletionChunk]:
            stream = await client.chat.completions.create(
                **chat(f"q{i}", stream=True, stream_options={"include_usage": True})
            )
            opened[i] = anyio.current_time()
            async with stream:
                return [chunk async for chunk in stream]

        start = anyio.current_time()
        streams = await gather(6, one)
        ended = anyio.current_time()
    assert len(sim.requests) == 1
    for i, chunks in enumerate(streams):
        assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == sim.expected_output(f"q{i}", TEXT)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-2].choices[0].finish_reason == "stop"
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert len({c.id for c in chunks}) == 1
        assert chunks[0].model == "gpt-4o-mini"
    # Each stream opened as its own item was written, not when the reply ended.
    assert min(opened.values()) < ended - 0.1 * (ended - start)
    stats = sim.statistics()
    usages = [chunks[-1].usage for chunks in streams]
    assert sum(u.prompt_tokens for u in usages if u) == stats.prompt_tokens
    assert sum(u.completion_tokens for u in usages if u) == stats.completion_tokens


@pytest.mark.anyio
async def test_openai_streams_without_usage_and_closed_early() -> None:
    sim = SimulatedProvider()
    rf = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:

        async def one(i: int) -> Any:
            stream = await client.chat.completions.create(
                **chat(f"mail {i}", response_format=rf, stream=True)
            )
            chunks = [chunk async for chunk in stream]
            assert all(chunk.usage is None for chunk in chunks)
            return json.loads("".join(c.choices[0].delta.content or "" for c in chunks))

        answers = await gather(4, one)
        early = await client.chat.completions.create(**chat("q", stream=True))
        first = await early.__anext__()
        await early.close()  # the caller stops reading: nothing else is disturbed
    assert first.choices[0].delta.role == "assistant"
    assert answers == [sim.expected_output(f"mail {i}", SCHEMA) for i in range(4)]


@pytest.mark.anyio
async def test_anthropic_streaming_callers_get_their_own_events() -> None:
    sim = SimulatedProvider()
    tool = {
        "tools": [{"name": "verdict", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "verdict"},
    }
    async with wrap(sim.anthropic_client(max_retries=0), max_items=4, packing="always") as client:

        async def one(i: int) -> list[Any]:
            extra = tool if i % 2 else {}
            stream = await client.messages.create(**msg(f"t{i}", stream=True, **extra))
            return [event async for event in stream]

        streams = await gather(4, one)
    assert len(sim.requests) == 2  # text and tool calls are different requests
    kinds = ["message_start", "content_block_start", "content_block_delta",
             "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    for i, events in enumerate(streams):
        assert [e.type for e in events] == kinds
        delta = events[2].delta
        if i % 2:
            assert events[1].content_block.type == "tool_use"
            assert json.loads(delta.partial_json) == sim.expected_output(f"t{i}", SCHEMA)
            assert events[4].delta.stop_reason == "tool_use"
        else:
            assert delta.text == sim.expected_output(f"t{i}", TEXT)
            assert events[4].delta.stop_reason == "end_turn"
    stats = sim.statistics()
    assert sum(s[4].usage.input_tokens for s in streams) == stats.prompt_tokens
    assert sum(s[4].usage.output_tokens for s in streams) == stats.completion_tokens


@pytest.mark.anyio
async def test_wrapped_client_statistics_per_model() -> None:
    sim = SimulatedProvider()
    events: list[Any] = []
    wrapped = wrap(
        sim.openai_client(max_retries=0),
        max_items=5,
        latency_budget=30.0,
        on_event=events.append,
        packing="always",
    )
    client = cast(coalesce.CoalescedClient, wrapped)
    assert client.statistics() == {}
    long: Any = {"role": "system", "content": " ".join(["Answer with care."] * 100)}

    def ask(i: int) -> Any:
        user: Any = {"role": "user", "content": f"q{i}"}
        return wrapped.chat.completions.create(model="gpt-4o-mini", messages=[long, user])

    await gather(10, ask)
    await wrapped.chat.completions.create(**chat("alone", n=2))  # passed through: not counted
    stats = client.statistics()["gpt-4o-mini"]
    assert (stats.calls, stats.requests, stats.items_per_request) == (10, 2, 5.0)
    assert stats.within_budget == 1.0
    assert stats.input_tokens == sum(r.prompt_tokens for r in sim.requests if r.items > 1)
    # Long shared instructions: five plain calls would have paid them five times.
    assert stats.input_tokens < stats.input_tokens_one_per_item
    assert 0.5 < stats.savings < 1
    assert events
    # A three-word system prompt: the packing costs more than it shares.
    await gather(5, lambda i: wrapped.chat.completions.create(**chat(f"s{i}")))
    await wrapped.close()
    short = client.statistics()["gpt-4o-mini"]
    assert short.requests == 3
    assert short.savings < stats.savings
    packed = sim.requests[-1]
    assert packed.items == 5
    assert packed.prompt_tokens > short.input_tokens_one_per_item - stats.input_tokens_one_per_item

"""Per-item admission: one bad item fails only its own caller, at once.

Pure checks first (the JSON check, the context-window table and the providers'
context-length messages, the group policy with hand-built jobs), then the promise
end to end: a poison item among nine innocent ones, through ``@coalesce.prompt`` and
through ``coalesce.wrap``, gives nine right answers, one failure and one request of
nine items (``prompt`` refuses an item past the window with ``InvalidInputError``;
``wrap`` sends it as the plain call would be sent, and the provider refuses it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import anthropic
import anyio
import httpx2
import openai
import pytest

import coalesce
from coalesce import InvalidInputError
from coalesce._batching.policy import DispatchReason, Due
from coalesce._calls import Job, RequestReport
from coalesce._engine.admission import Admission, ContextPolicy
from coalesce._planning.context import (
    ContextWindow,
    context_error_window,
    is_context_error,
    known_window,
)
from coalesce._planning.footprint import Footprint
from coalesce._planning.planner import PlanItem
from coalesce._planning.tokens import CharacterEstimator
from coalesce._validate import check_item, encode_item, json_path, jsonable
from coalesce._wrap import wrap
from coalesce.providers import CallableProvider, CompletionRequest
from coalesce.testing import SimulatedProvider

# -- the JSON check ----------------------------------------------------------------------


class Opaque:
    pass


BAD_JSON = [
    pytest.param(math.nan, "$", "nan", id="nan"),
    pytest.param({"score": math.inf}, "$.score", "inf", id="inf"),
    pytest.param({"tags": ["a", "b", -math.inf]}, "$.tags[2]", "-inf", id="-inf"),
    pytest.param({"text": "ok\ud800"}, "$.text", "lone surrogate '\\ud800' at index 2", id="sur"),
    pytest.param({"a\udfff": 1}, '$["a\\udfff"]', "key that holds a lone surrogate", id="key"),
    pytest.param({"blob": b"\xff"}, "$.blob", "is a bytes, which is not JSON", id="bytes"),
    pytest.param([1, {"x y": Opaque()}], '$[1]["x y"]', "is an Opaque", id="object"),
    pytest.param({"k": {1: "a", "b": 2}}, "$.k", "keys of mixed types (int, str)", id="mixed"),
    pytest.param({(1, 2): "a"}, "$", "a tuple key", id="tuple-key"),
    pytest.param({math.nan: 1}, "$", "has the key nan", id="nan-key"),
]


@pytest.mark.parametrize(("item", "field", "said"), BAD_JSON)
def test_an_item_that_is_not_strict_json_is_refused_naming_the_field(
    item: Any, field: str, said: str
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_item(item)
    assert caught.value.field == field
    message = str(caught.value)
    assert said in message
    assert field in message
    message.encode("utf-8")  # the message itself is printable, surrogates escaped


def test_a_circular_item_is_refused_where_it_loops() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(InvalidInputError, match="circular") as caught:
        check_item({"a": loop})
    assert caught.value.field == "$.a[1]"


@pytest.mark.parametrize(
    "item",
    [None, True, 0, -1.5, 10**30, "", "héllo 🌍", [], {}, {"b": [1, {"c": None}], "a": "x"}],
)
def test_json_items_pass_and_encode_canonically(item: Any) -> None:
    check_item(item)
    key, size = encode_item(item)
    assert key == json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert size == len(key.encode("utf-8"))


@pytest.mark.parametrize(
    ("key", "path"),
    [("text", "$.text"), ("a b", '$["a b"]'), (1, '$["1"]'), ("café", '$["caf\\u00e9"]')],
)
def test_both_steps_of_the_check_write_paths_alike(key: Any, path: str) -> None:
    assert json_path("$", key) == path
    with pytest.raises(InvalidInputError) as converting:
        jsonable({key: [b"x"]}, field="$", subject="f: argument 'x'")
    assert converting.value.field == f"{path}[0]"
    assert f"at {path}[0] is bytes" in str(converting.value)
    with pytest.raises(InvalidInputError) as encoding:
        check_item({key: [math.nan]})
    assert encoding.value.field == f"{path}[0]"


# -- the table of context windows ----------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o-mini", 128_000),
        ("gpt-4o-2024-08-06", 128_000),
        ("gpt-4.1-nano", 1_047_576),
        ("gpt-5-mini", 400_000),
        ("o3-mini", 200_000),
        ("o4-mini-2025-04-16", 200_000),
        ("gpt-4-turbo", 128_000),
        ("gpt-3.5-turbo-0125", 16_385),
        ("claude-3-5-haiku-latest", 200_000),
        ("claude-sonnet-4-5", 200_000),
        ("meta-llama/Llama-3.1-8B-Instruct", 128_000),
        ("llama3.2:3b", 128_000),
        ("Qwen/Qwen2.5-7B-Instruct", 32_768),
        ("SmolLM2-135M-Instruct", 8_192),
        ("mistral-small-latest", 32_768),
        ("mixtral-8x7b-instruct", 32_768),
        ("my-finetune", None),
        ("m", None),
    ],
)
def test_known_windows(model: str, window: int | None) -> None:
    assert known_window(model) == window


# -- what providers say when a request is too long ------------------------------------------

_REQUEST = httpx2.Request("POST", "https://api.test/v1/chat/completions")


def openai_error(body: dict[str, Any], status: int = 400) -> openai.APIStatusError:
    """The SDK's own exception for an error response with ``body``."""
    client = openai.AsyncOpenAI(api_key="x")
    return client._make_status_error_from_response(
        httpx2.Response(status, json=body, request=_REQUEST)
    )


def anthropic_error(message: str) -> anthropic.APIStatusError:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    client = anthropic.AsyncAnthropic(api_key="x")
    return client._make_status_error_from_response(
        httpx2.Response(400, json=body, request=_REQUEST)
    )


def openai_message(message: str, **fields: Any) -> openai.APIStatusError:
    return openai_error({"error": {"message": message, "type": "invalid_request_error", **fields}})


# What llama.cpp's server (xllamacpp) answers, captured from a real run.
LLAMA_CPP_ERROR = openai_error(
    {
        "code": 400,
        "message": "request (6031 tokens) exceeds the available context size (1024 tokens),"
        " try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 6031,
        "n_ctx": 1024,
    }
)
VLLM_ERROR = openai_message(
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"
    " (4000 in the messages, 1000 in the completion). Please reduce the length of the"
    " messages or completion."
)

STATED = [
    pytest.param(
        openai_message(
            "This model's maximum context length is 128000 tokens. However, your messages"
            " resulted in 130512 tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
        ),
        128_000,
        id="openai",
    ),
    pytest.param(
        anthropic_error("prompt is too long: 210000 tokens > 200000 maximum"), 200_000, id="claude"
    ),
    pytest.param(
        anthropic_error(
            "input length and `max_tokens` exceed context limit: 198000 + 4096 > 200000,"
            " decrease input length or `max_tokens` and try again"
        ),
        200_000,
        id="claude-max-tokens",
    ),
    pytest.param(LLAMA_CPP_ERROR, 1024, id="llama.cpp"),
    pytest.param(VLLM_ERROR, 4096, id="vllm"),
    pytest.param(
        openai_message(
            "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum"
            " context length is 4096 tokens and your request has 2778 input tokens"
            " (8000 > 4096 - 2778)."
        ),
        4096,
        id="vllm-max-tokens",
    ),
    pytest.param(
        openai_message(
            "The decoder prompt (length 5000) is longer than the maximum model length of 4096."
        ),
        4096,
        id="vllm-decoder",
    ),
    pytest.param(
        RuntimeError(
            "Prompt contains 40000 tokens, too large for model with 32768 maximum context length"
        ),
        32_768,
        id="mistral",
    ),
]


@pytest.mark.parametrize(("error", "window"), STATED)
def test_a_context_error_tells_the_window(error: BaseException, window: int) -> None:
    assert context_error_window(error) == window
    assert is_context_error(error)
    wrapped = RuntimeError("the request failed")
    wrapped.__cause__ = error
    assert context_error_window(wrapped) == window  # also as the cause of another


@pytest.mark.parametrize(
    "error",
    [
        openai_error(  # llama.cpp before it stated the size
            {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "invalid_request_error",
            }
        ),
        openai_message(
            "Your input exceeds the context window of this model. Please adjust your input.",
            code="context_length_exceeded",
        ),
        RuntimeError("Context size has been exceeded."),
    ],
)
def test_a_context_error_without_a_number(error: BaseException) -> None:
    assert context_error_window(error) is None
    assert is_context_error(error)


@pytest.mark.parametrize(
    "error",
    [
        openai_message("Rate limit reached for gpt-4o-mini", code="rate_limit_exceeded"),
        openai_message(
            "max_tokens is too large: 20000. This model supports at most 16384 completion tokens"
        ),
        anthropic_error("max_tokens: Field required"),
        ValueError("boom"),
    ],
)
def test_other_errors_are_not_context_errors(error: BaseException) -> None:
    assert context_error_window(error) is None
    assert not is_context_error(error)


def report(jobs: Sequence[Job], error: BaseException | None) -> RequestReport:
    return RequestReport(
        slots={str(i): [job] for i, job in enumerate(jobs, 1)},
        plain=False,
        text=False,
        reask=False,
        completion=None,
        error=error,
        error_headers={},
        outcomes={},
        streamed=False,
        seconds=1.0,
        now=0.0,
    )


def test_the_window_comes_from_the_table_the_option_then_the_provider() -> None:
    window = ContextWindow("gpt-4o-mini")
    assert (window.limit, window.source) == (128_000, "known for 'gpt-4o-mini'")
    assert ContextWindow("gpt-4o-mini", 1_000_000).limit == 1_000_000
    assert ContextWindow("my-finetune").limit is None
    window.request_done(report([job("x")], openai_message("Rate limit reached")))
    assert window.limit == 128_000  # not a context error: nothing learned
    window.request_done(report([job("x")], VLLM_ERROR))
    assert window.limit == 4096
    assert "provider" in window.source


def test_a_window_without_a_number_is_learned_as_smaller_than_what_was_sent() -> None:
    window = ContextWindow("my-finetune", estimator=CharacterEstimator(1.0), shared_tokens=100)
    jobs = [job("a" * 1000, tokens=1, output=20), job("b" * 500, tokens=1, output=20)]
    window.request_done(report(jobs, RuntimeError("Context size has been exceeded.")))
    # 100 shared + (1002 + 20) + (502 + 20) tokens were sent: the window is smaller.
    assert window.limit == 1643
    assert not window.learn(ValueError("boom"), sent_tokens=10)
    assert window.limit == 1643


# -- admission and the group policy, with hand-built jobs ------------------------------------

COSTS = Footprint(shared=1000, plain_shared=900, item_frame=10, answer_frame=3)


def job(item: Any, tokens: int | None = None, output: int = 50) -> Job:
    key, _ = encode_item(item)
    plan = None if tokens is None else PlanItem(tokens, output, math.inf, 0.0)
    return Job(item, key, math.inf, plan=plan)


def admit(gate: Admission, call: Job, size: int) -> PlanItem:
    """Admit ``call`` as the engine does: its plan, if any, in; the plan to keep out."""
    return gate.admit(call.item, size, call.plan, deadline=call.deadline, arrival=call.arrival)


def admission(window: int | None = 128_000, **options: Any) -> Admission:
    context = ContextWindow("my-model", window)
    return Admission(context, COSTS, CharacterEstimator(1.0), output_tokens=50, **options)


def test_an_item_too_large_for_the_window_alone_is_refused_with_the_fix() -> None:
    gate = admission(10_000)
    admit(gate, job("x", tokens=8937), 0)  # 1000 + 10 + 8937 + 53 = 10,000: fits exactly
    with pytest.raises(InvalidInputError) as caught:
        admit(gate, job("x", tokens=8938), 0)
    message = str(caught.value)
    assert "8,938 tokens" in message
    assert "10,001 tokens" in message
    assert "context window of 10,000 (set by context_window=)" in message
    assert "Shorten the item" in message
    assert "context_window=" in message
    # The whole reply cap is reserved when one is set.
    with pytest.raises(InvalidInputError, match="room for its output \\(2,000\\)") as capped:
        admit(admission(10_000, reply_cap=2000), job("x", tokens=7000), 0)
    assert "lower max_output_tokens" in str(capped.value)
    assert "max_output_tokens" not in message


def test_small_items_are_planned_by_their_size_large_ones_counted() -> None:
    gate = admission(20_000, max_items=8)
    # 8 x 2000 bytes fit the window whatever the tokens; 8 x 2500 do not: counted (1
    # token per character here).
    small = admit(gate, job("s" * 100), size=2000)
    large = admit(gate, job("L" * 5000), size=2500)
    assert (small.input_tokens, large.input_tokens) == (2000, 5002)
    assert small.output_tokens == 50
    with pytest.raises(InvalidInputError):
        admit(gate, job("L" * 19_000), size=19_002)
    huge = admit(admission(None), job("x" * 10), size=10**9)  # no window known: nothing to check
    assert huge.input_tokens == 10**9


class Inner:
    """A policy that records its questions and gives set answers."""

    def __init__(self, before: DispatchReason | None = None) -> None:
        self.before = before
        self.asked: list[int] = []

    def before_add(self, members: Sequence[Job], item: Job, now: float) -> DispatchReason | None:
        self.asked.append(len(members))
        return self.before

    def after_add(self, members: Sequence[Job], now: float) -> Due | None:
        return Due(now + 1.0, DispatchReason.DEADLINE)


def test_items_that_fit_alone_are_not_packed_past_the_window() -> None:
    policy = ContextPolicy(admission(128_000))
    big = [job(f"big {i}", tokens=100_000) for i in range(10)]
    assert policy.before_add([], big[0], 0.0) is None  # an empty window takes anything
    assert policy.before_add(big[:1], big[1], 0.0) is DispatchReason.TOKENS
    small = [job(f"small {i}", tokens=12_000) for i in range(11)]
    # 1000 shared + n x (12,000 + 10 + 50 + 3): ten fit 128,000, eleven do not.
    assert policy.before_add(small[:9], small[9], 0.0) is None
    assert policy.before_add(small[:10], small[10], 0.0) is DispatchReason.TOKENS
    assert policy.after_add(small[:10], 0.0) is None  # no inner policy: max_wait
    # With a reply cap, the cap is reserved: 1000 + n x 12,010 + 30,000: eight fit.
    capped = ContextPolicy(admission(128_000, reply_cap=30_000))
    assert capped.before_add(small[:7], small[7], 0.0) is None
    assert capped.before_add(small[:8], small[8], 0.0) is DispatchReason.TOKENS


def test_the_context_policy_composes_with_an_inner_policy() -> None:
    big = [job(f"big {i}", tokens=100_000) for i in range(2)]
    small = [job(f"small {i}", tokens=100) for i in range(2)]
    inner = Inner(DispatchReason.DEADLINE)
    policy = ContextPolicy(admission(128_000), inner)
    assert policy.before_add(small[:1], small[1], 0.0) is DispatchReason.DEADLINE
    assert policy.before_add(big[:1], big[1], 0.0) is DispatchReason.TOKENS
    assert inner.asked == [1, 0]  # asked about the newcomer alone, for SOLO
    assert policy.after_add(small, 5.0) == Due(6.0, DispatchReason.DEADLINE)
    solo = ContextPolicy(admission(128_000), Inner(DispatchReason.SOLO))
    assert solo.before_add(big[:1], big[1], 0.0) is DispatchReason.SOLO


def test_a_learned_window_closes_groups_from_then_on() -> None:
    gate = admission(None)
    policy = ContextPolicy(gate)
    jobs = [job(f"item {i}", tokens=3000) for i in range(3)]
    assert policy.before_add(jobs[:2], jobs[2], 0.0) is None  # unknown window: no limit
    gate.window.learn(LLAMA_CPP_ERROR)
    assert gate.window.limit == 1024
    assert policy.before_add(jobs[:1], jobs[1], 0.0) is DispatchReason.TOKENS


# -- end to end: one poison item among nine innocent ones -------------------------------------

# smollm2's window is 8,192 tokens: a 10,000-word item cannot fit.
TOO_LARGE = "word " * 10_000

POISON = [
    pytest.param({"id": 9, "text": math.nan}, id="nan"),
    pytest.param({"id": 9, "text": math.inf}, id="inf"),
    pytest.param({"id": 9, "text": -math.inf}, id="-inf"),
    pytest.param({"id": 9, "text": "bad \ud83d here"}, id="surrogate-value"),
    pytest.param({"id": 9, "text": "ok", "\udc80key": 1}, id="surrogate-key"),
    pytest.param({"id": 9, "text": b"\xff\xfe"}, id="bytes"),
    pytest.param({"id": 9, "text": Opaque()}, id="object"),
    pytest.param({"id": 9, "text": TOO_LARGE}, id="too-many-tokens"),
]


def answer_of(item: dict[str, Any]) -> str:
    return f"answer {item['id']}"


async def answer_each(request: CompletionRequest, seen: list[int]) -> str:
    """A fake model answering each item with ``answer <its id>``."""
    if request.user.startswith("[{"):
        items = json.loads(request.user)
        seen.append(len(items))
        return json.dumps({"results": {i["id"]: answer_of(i["input"]) for i in items}})
    seen.append(1)
    return answer_of(json.loads(request.user))


async def call_all(fn: Any, items: Sequence[Any]) -> list[Any]:
    results: list[Any] = [None] * len(items)

    async def one(index: int, item: Any) -> None:
        try:
            results[index] = await fn(item)
        except Exception as exc:
            results[index] = exc

    async with anyio.create_task_group() as tg:
        for index, item in enumerate(items):
            tg.start_soon(one, index, item)
    return results


def assert_nine_right_and_one_refused(results: list[Any], expected: list[Any]) -> None:
    *innocent, poisoned = results
    assert innocent == expected
    assert isinstance(poisoned, InvalidInputError), poisoned


@pytest.mark.anyio
@pytest.mark.parametrize("poison", POISON)
async def test_prompt_a_poison_item_fails_only_its_caller(poison: dict[str, Any]) -> None:
    seen: list[int] = []

    async def fake(request: CompletionRequest) -> str:
        return await answer_each(request, seen)

    @coalesce.prompt(
        packing="always", client=CallableProvider(fake), model="smollm2", max_items=10, max_wait=0.5
    )
    async def reply(ticket: dict[str, Any]) -> str:
        """Answer the ticket."""

    items = [{"id": i, "text": f"ticket {i}"} for i in range(9)]
    results = await call_all(reply, [*items, poison])
    await reply.aclose()
    assert_nine_right_and_one_refused(results, [answer_of(item) for item in items])
    assert seen == [9]  # one request, of the nine innocent items


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], **extra}


def message(text: str) -> dict[str, Any]:
    return {
        "model": "claude-3-5-haiku",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": text}],
    }


# A wrapped call's item is its last message's text: the poisons a string can carry. The
# surrogate cannot be sent at all (coalesce refuses it with InvalidInputError before
# anything is sent); the item past the model's window is sent as it is, as the plain
# call would be, and the provider refuses it with the SDK's own error. Either way the
# nine others share one request.
WRAP_POISON = [
    pytest.param("bad \ud800 here", None, id="surrogate"),
    pytest.param("word " * 210_000, 1, id="too-many-tokens"),  # past 128k and 200k windows
]

#: The windows the simulator enforces, as the real models do.
WINDOWS = {"gpt-4o-mini": 128_000, "claude-3-5-haiku": 200_000}


def assert_nine_right_and_one_failed(
    results: list[Any], expected: list[Any], sent_alone: int | None, sdk_error: type[Exception]
) -> None:
    *innocent, poisoned = results
    assert innocent == expected
    if sent_alone is None:
        assert isinstance(poisoned, InvalidInputError), poisoned
    else:  # the plain call's own failure: the SDK's error, the provider's words
        assert isinstance(poisoned, sdk_error), poisoned
        assert is_context_error(poisoned), poisoned


@pytest.mark.anyio
@pytest.mark.parametrize(("poison", "sent_alone"), WRAP_POISON)
@pytest.mark.parametrize("stream", [False, True])
async def test_wrap_openai_a_poison_item_fails_only_its_caller(
    poison: str, sent_alone: int | None, stream: bool
) -> None:
    sim = SimulatedProvider(context_window=WINDOWS)
    texts = [f"q{i}" for i in range(9)]

    async def create(text: str) -> str:
        reply = await client.chat.completions.create(**chat(text, stream=stream))
        if not stream:
            return str(reply.choices[0].message.content)
        return "".join(
            [chunk.choices[0].delta.content or "" async for chunk in reply if chunk.choices]
        )

    async with wrap(
        sim.openai_client(max_retries=0), max_items=10, max_wait=0.5, packing="always"
    ) as client:
        results = await call_all(create, [*texts, poison])
    assert_nine_right_and_one_failed(
        results,
        [sim.expected_output(t, {"type": "string"}) for t in texts],
        sent_alone,
        openai.BadRequestError,
    )
    assert sorted(r.items for r in sim.requests) == sorted(
        [9, *([sent_alone] if sent_alone else [])]
    )


@pytest.mark.anyio
@pytest.mark.parametrize(("poison", "sent_alone"), WRAP_POISON)
async def test_wrap_anthropic_a_poison_item_fails_only_its_caller(
    poison: str, sent_alone: int | None
) -> None:
    sim = SimulatedProvider(context_window=WINDOWS)
    texts = [f"t{i}" for i in range(9)]

    async def create(text: str) -> str:
        reply = await client.messages.create(**message(text))
        block = reply.content[0]
        assert block.type == "text"
        return str(block.text)

    async with wrap(
        sim.anthropic_client(max_retries=0), max_items=10, max_wait=0.5, packing="always"
    ) as client:
        results = await call_all(create, [*texts, poison])
    assert_nine_right_and_one_failed(
        results,
        [sim.expected_output(t, {"type": "string"}) for t in texts],
        sent_alone,
        anthropic.BadRequestError,
    )
    assert sorted(r.items for r in sim.requests) == sorted(
        [9, *([sent_alone] if sent_alone else [])]
    )


@pytest.mark.anyio
async def test_ten_large_items_never_share_a_request_past_the_window() -> None:
    seen: list[int] = []

    async def fake(request: CompletionRequest) -> str:
        return await answer_each(request, seen)

    # smollm2: 8,192 tokens. Each item is about 3,000 tokens: two fit a request, three do not.
    @coalesce.prompt(
        packing="always", client=CallableProvider(fake), model="smollm2", max_items=10, max_wait=0.5
    )
    async def reply(ticket: dict[str, Any]) -> str:
        """Answer the ticket."""

    items = [{"id": i, "text": f"ticket {i} " + "word " * 3000} for i in range(10)]
    results = await call_all(reply, items)
    await reply.aclose()
    assert results == [answer_of(item) for item in items]
    assert sorted(seen) == [2, 2, 2, 2, 2]


@pytest.mark.anyio
async def test_a_window_learned_from_the_provider_refuses_later_items_at_once() -> None:
    seen: list[int] = []

    async def fake(request: CompletionRequest) -> str:
        if len(request.user) > 2000:
            seen.append(-1)
            raise RuntimeError(
                "This model's maximum context length is 1000 tokens. However, you requested"
                " 1500 tokens. Please reduce the length of the messages."
            )
        return await answer_each(request, seen)

    # An unknown model: nothing is checked until the provider says its window.
    @coalesce.prompt(
        packing="always",
        client=CallableProvider(fake),
        model="my-model",
        max_items=10,
        max_wait=0.5,
    )
    async def reply(ticket: dict[str, Any]) -> str:
        """Answer the ticket."""

    with pytest.raises(InvalidInputError, match="too large for the model's context") as info:
        await reply({"id": 0, "text": "x" * 2100})
    assert isinstance(info.value.__cause__, RuntimeError)  # the provider's own, as the cause
    assert "maximum context length is 1000 tokens" in str(info.value)
    assert seen == [-1]
    with pytest.raises(InvalidInputError, match="1,000 \\(as the provider's context-length"):
        await reply({"id": 5, "text": "word " * 1200})
    assert await reply({"id": 6, "text": "short"}) == "answer 6"
    await reply.aclose()
    assert seen == [-1, 1]  # the refused item never reached the model


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_wrap_answers_a_call_past_the_window_as_the_plain_call(kind: str) -> None:
    # The deployment's window is far smaller than the table's figure for the model. A
    # call too long for it fails as the plain call would, with the SDK's own error,
    # before (nothing known) and after the window is learned (sent as it is, alone).
    sim = SimulatedProvider(context_window=2000)
    long, short = "river stone light " * 900, "hi"  # some 2,700 tokens, and a few
    sdk_error = openai.BadRequestError if kind == "openai" else anthropic.BadRequestError

    async def create(text: str) -> str:
        if kind == "openai":
            reply = await client.chat.completions.create(**chat(text))
            return str(reply.choices[0].message.content)
        answer = await client.messages.create(**message(text))
        block = answer.content[0]
        assert block.type == "text"
        return str(block.text)

    sdk_client = (
        sim.openai_client(max_retries=0)
        if kind == "openai"
        else sim.anthropic_client(max_retries=0)
    )
    async with wrap(sdk_client, max_wait=0.0, packing="always") as client:
        for _ in range(2):
            with pytest.raises(sdk_error) as info:
                await create(long)
            assert is_context_error(info.value)
        assert await create(short) == sim.expected_output(short, {"type": "string"})
    assert [r.status for r in sim.requests] == [400, 400, 200]

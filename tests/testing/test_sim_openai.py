"""The simulator's OpenAI Chat Completions API, through the official SDK, in process.

Runs on virtual time (both backends): latencies are asserted exactly.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
import httpx2
import openai
import pytest
from pydantic import BaseModel, Field

from coalesce._wire.packing import pack_request, split_reply
from coalesce.providers._shapes import openai_response_format
from coalesce.testing import (
    FaultPlan,
    LatencyProfile,
    LongTail,
    RateLimit,
    SimulatedLatency,
    SimulatedProvider,
    compute_delays,
    expected_output,
)

pytestmark = pytest.mark.anyio

PROFILE = LatencyProfile(ttft=0.5, prompt_token_seconds=0.001, tokens_per_second=50)
MODEL = "gpt-4o-mini"

# The openai SDK stops reading its SSE generators at [DONE] without closing them;
# trio warns when such a generator is collected. Nothing the simulator can change.
SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    confidence: float = Field(ge=0, le=1)
    keywords: list[str] = Field(max_length=3)


def packed(inputs: list[Any]) -> tuple[Any, list[str]]:
    items = [{"id": str(i), "input": value} for i, value in enumerate(inputs, 1)]
    messages = [
        {"role": "system", "content": "Classify each item."},
        {"role": "user", "content": json.dumps(items)},
    ]
    return messages, [item["id"] for item in items]


async def _complete(client: openai.AsyncOpenAI, *, stream: bool) -> None:
    """One chat completion, read to the end."""
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], stream=stream
    )
    if stream:
        async for _ in reply:  # type: ignore[union-attr]
            pass


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(latency=SimulatedLatency(default=PROFILE))


@pytest.fixture
async def client(sim: SimulatedProvider) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sim.openai_client(max_retries=0) as client:
        yield client


async def test_packed_request_gets_one_output_per_item(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    inputs = ["good", {"text": "bad"}, 3]
    messages, ids = packed(inputs)
    start = anyio.current_time()
    reply = await client.chat.completions.create(model=MODEL, messages=messages)
    elapsed = anyio.current_time() - start
    content = reply.choices[0].message.content
    assert content is not None
    assert json.loads(content) == {
        "results": {i: expected_output(x) for i, x in zip(ids, inputs, strict=True)}
    }
    assert reply.choices[0].finish_reason == "stop"
    (record,) = sim.requests
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
    assert record.items == 3
    assert record.status == 200
    assert record.api == "openai.chat"
    assert elapsed == pytest.approx(
        compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens).total
    )
    assert record.finished_at - record.started_at == pytest.approx(elapsed)


@SDK_STREAMS
async def test_streaming_with_usage(sim: SimulatedProvider, client: openai.AsyncOpenAI) -> None:
    messages, _ = packed(["a", "b"])
    whole = await client.chat.completions.create(model=MODEL, messages=messages)
    start = anyio.current_time()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        else:
            usage = chunk.usage
    assert text == whole.choices[0].message.content
    assert finish == "stop"
    assert usage is not None
    assert usage == whole.usage
    record = sim.requests[-1]
    assert record.stream
    assert anyio.current_time() - start == pytest.approx(
        compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens).total, abs=1e-3
    )  # looptime rounds each of the many chunk sleeps to the microsecond


@SDK_STREAMS
async def test_streaming_without_usage_has_no_usage_chunk(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(chunk.choices for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected_output("hi")


@SDK_STREAMS
async def test_chunks_are_paced_by_the_decode_rate(sim: SimulatedProvider) -> None:
    # In process the ASGI transport buffers the body, so pacing is observed in the app:
    # the answer's total time is first token plus decode, whatever the chunking.
    sim.output_tokens = 200
    async with sim.openai_client(max_retries=0) as client:
        start = anyio.current_time()
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "long"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
    record = sim.requests[-1]
    assert record.completion_tokens >= 150
    assert text.startswith(expected_output("long"))
    assert anyio.current_time() - start == pytest.approx(
        compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens).total, abs=1e-3
    )  # looptime rounds each of the many chunk sleeps to the microsecond


async def test_json_schema_with_the_sdk_parse_helper(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "great film"}], response_format=Sentiment
    )
    parsed = reply.choices[0].message.parsed
    expected = expected_output("great film", Sentiment.model_json_schema())
    assert parsed == Sentiment.model_validate(expected)
    # Constrained by a schema, the reply is compact JSON, as OpenAI's structured outputs.
    compact = json.dumps(expected, separators=(",", ":"), ensure_ascii=False)
    assert reply.choices[0].message.content == compact


async def test_json_object_mode(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "q"}],
        response_format={"type": "json_object"},
    )
    content = reply.choices[0].message.content or ""
    assert json.loads(content) == {"output": expected_output("q")}
    assert ", " in content or ": " in content  # asked in the prompt alone: spaced JSON


async def test_wire_format_v1_round_trip_with_the_client_side(client: openai.AsyncOpenAI) -> None:
    inputs = [{"text": f"review {n}"} for n in range(6)]
    schema = Sentiment.model_json_schema()
    request = pack_request("Classify each review.", inputs, schema)
    reply = await client.chat.completions.create(  # type: ignore[call-overload]
        model=MODEL,
        messages=[
            {"role": "system", "content": request.system},
            {"role": "user", "content": request.user},
        ],
        response_format=openai_response_format(request.reply_schema),
    )
    split = split_reply(
        reply.choices[0].message.content or "", request.ids, Sentiment.model_validate
    )
    assert not split.failures
    for item_id, item in zip(request.ids, inputs, strict=True):
        assert split.values[item_id] == Sentiment.model_validate(expected_output(item, schema))


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_truncates_with_finish_reason_length(
    client: openai.AsyncOpenAI, field: str
) -> None:
    messages, _ = packed(list(range(20)))
    reply = await client.chat.completions.create(model=MODEL, messages=messages, **{field: 25})  # type: ignore[call-overload]
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 25
    full = json.dumps({"results": {str(i): expected_output(i - 1) for i in range(1, 21)}})
    assert full.startswith(reply.choices[0].message.content or "-")


async def test_invalid_requests_get_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="messages"):
        await client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=0
        )


# ------------------------------------------------------------------------ faults


async def test_http_faults(sim: SimulatedProvider, client: openai.AsyncOpenAI) -> None:
    sim.inject("rate_limit", "server_error", "unavailable", None)
    with pytest.raises(openai.RateLimitError) as rate:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert rate.value.response.headers["retry-after"] == "1"
    assert rate.value.response.headers["x-request-id"].startswith("req_")
    with pytest.raises(openai.InternalServerError) as server:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert server.value.status_code == 500
    with pytest.raises(openai.InternalServerError) as unavailable:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert unavailable.value.status_code == 503
    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert [(r.status, r.faults) for r in sim.requests] == [
        (429, ("rate_limit",)),
        (500, ("server_error",)),
        (503, ("unavailable",)),
        (200, ()),
    ]
    assert sim.statistics().rate_limited == 1
    assert sim.statistics().faults == 3


async def test_the_sdk_retries_through_faults(sim: SimulatedProvider) -> None:
    sim.inject("server_error", "rate_limit")
    async with sim.openai_client(max_retries=2) as client:
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert reply.choices[0].message.content == expected_output("x")
    assert [r.status for r in sim.requests] == [500, 429, 200]


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect(sim: SimulatedProvider, client: openai.AsyncOpenAI, stream: bool) -> None:
    sim.inject("disconnect")
    with pytest.raises(openai.APIConnectionError):
        await _complete(client, stream=stream)
    assert sim.requests[-1].faults == ("disconnect",)


async def test_hang_outlasts_the_client_timeout(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    sim.inject("hang")
    start = anyio.current_time()
    with anyio.move_on_after(30) as scope:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert scope.cancelled_caught
    assert anyio.current_time() - start == pytest.approx(30)
    (record,) = sim.requests
    assert (record.status, record.faults) == (499, ("hang",))


async def test_hang_ends_eventually() -> None:
    sim = SimulatedProvider(faults=FaultPlan(script=["hang"], hang_seconds=100))
    async with sim.openai_client(max_retries=0) as client:
        start = anyio.current_time()
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert anyio.current_time() - start > 100


async def test_item_faults(sim: SimulatedProvider, client: openai.AsyncOpenAI) -> None:
    messages, ids = packed(list(range(6)))
    sim.inject("missing_item", "extra_id", "duplicate_id", "out_of_order")
    outputs = []
    for _ in range(4):
        reply = await client.chat.completions.create(model=MODEL, messages=messages)
        # Every key as written, repeats included (a dict would keep one of each).
        pairs = json.loads(reply.choices[0].message.content or "", object_pairs_hook=list)
        outputs.append(pairs[0][1])
    missing, extra, duplicated, shuffled = ([key for key, _ in out] for out in outputs)
    assert len(missing) == 5
    assert set(missing) < set(ids)
    assert len(extra) == 7
    assert len(set(extra) - set(ids)) == 1
    assert len(duplicated) == 7
    assert len(set(duplicated)) == 6
    assert shuffled != ids
    assert sorted(shuffled) == ids
    assert [r.faults for r in sim.requests] == [
        ("missing_item",),
        ("extra_id",),
        ("duplicate_id",),
        ("out_of_order",),
    ]


async def test_text_faults(sim: SimulatedProvider, client: openai.AsyncOpenAI) -> None:
    messages, ids = packed(["a", "b"])
    sim.inject("prose", "code_fence", "malformed_json", "truncate")
    texts, finishes = [], []
    for _ in range(4):
        reply = await client.chat.completions.create(model=MODEL, messages=messages)
        texts.append(reply.choices[0].message.content or "")
        finishes.append(reply.choices[0].finish_reason)
    for text in texts:
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
    assert texts[0].startswith("Sure!")
    assert texts[1].startswith("```json")
    assert finishes == ["stop", "stop", "stop", "length"]
    for text in texts[:2]:
        split = split_reply(text, ids, str)
        assert split.values == {"1": expected_output("a"), "2": expected_output("b")}


async def test_probabilistic_faults_are_seeded() -> None:
    async def run() -> list[tuple[str, ...]]:
        sim = SimulatedProvider(
            faults=FaultPlan(probabilities={"server_error": 0.3, "prose": 0.3}, seed=11)
        )
        async with sim.openai_client(max_retries=0) as client:
            for _ in range(20):
                with contextlib.suppress(openai.InternalServerError):
                    await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "x"}]
                    )
        return [r.faults for r in sim.requests]

    first = await run()
    assert first == await run()
    assert {("server_error",), ("prose",), ()} == set(first)


# ------------------------------------------------------------------- rate limits


async def test_rate_limits_per_key_with_headers() -> None:
    sim = SimulatedProvider(rate_limits=RateLimit(requests_per_minute=2, tokens_per_minute=10_000))
    async with (
        sim.openai_client(max_retries=0, api_key="sk-a") as a,
        sim.openai_client(max_retries=0, api_key="sk-b") as b,
    ):
        messages: Any = [{"role": "user", "content": "x"}]
        raw = await a.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        assert raw.headers["x-ratelimit-limit-requests"] == "2"
        assert raw.headers["x-ratelimit-remaining-requests"] == "1"
        assert raw.headers["x-ratelimit-limit-tokens"] == "10000"
        assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 10_000
        await a.chat.completions.create(model=MODEL, messages=messages)
        with pytest.raises(openai.RateLimitError) as error:
            await a.chat.completions.create(model=MODEL, messages=messages)
        headers = error.value.response.headers
        assert headers["x-ratelimit-remaining-requests"] == "0"
        retry = float(headers["retry-after-ms"]) / 1000
        assert 0 < retry <= 30
        await b.chat.completions.create(model=MODEL, messages=messages)  # another key
        await anyio.sleep(retry)
        await a.chat.completions.create(model=MODEL, messages=messages)
    assert [r.status for r in sim.requests] == [200, 200, 429, 200, 200]
    assert [r.api_key for r in sim.requests] == ["sk-a", "sk-a", "sk-a", "sk-b", "sk-a"]
    assert sim.statistics().rate_limited == 1
    assert sim.statistics().faults == 0


async def test_token_rate_limit() -> None:
    sim = SimulatedProvider(rate_limits=RateLimit(tokens_per_minute=100), time_scale=0.01)
    async with sim.openai_client(max_retries=0) as client:
        messages, _ = packed(list(range(5)))
        with pytest.raises(openai.RateLimitError, match="tokens per min"):
            await client.chat.completions.create(model=MODEL, messages=messages)


# ------------------------------------------------------- latency, lengths, accounting


async def test_time_scale_and_jitter_are_deterministic() -> None:
    async def timings(seed: int) -> list[float]:
        sim = SimulatedProvider(
            latency=SimulatedLatency(default=PROFILE, jitter=0.5), time_scale=0.1, seed=seed
        )
        out = []
        async with sim.openai_client(max_retries=0) as client:
            for _ in range(3):
                start = anyio.current_time()
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "x"}]
                )
                out.append(anyio.current_time() - start)
        return out

    first = await timings(1)
    assert first == pytest.approx(await timings(1))
    assert first != pytest.approx(await timings(2))
    assert all(0.05 * 0.5 < t < 0.15 * 2 for t in first)


async def test_per_model_latency(sim: SimulatedProvider) -> None:
    sim.latency = SimulatedLatency(default=PROFILE, models={"slow": LatencyProfile(ttft=10)})
    async with sim.openai_client(max_retries=0) as client:
        start = anyio.current_time()
        await client.chat.completions.create(
            model="slow-v2", messages=[{"role": "user", "content": "x"}]
        )
        assert anyio.current_time() - start > 10


async def test_output_length_long_tail(sim: SimulatedProvider) -> None:
    sim.output_tokens = LongTail(median=30, sigma=1.0)
    async with sim.openai_client(max_retries=0) as client:
        messages, _ = packed(list(range(40)))
        reply = await client.chat.completions.create(model=MODEL, messages=messages)
    results = json.loads(reply.choices[0].message.content or "")["results"]
    assert list(results.values()) == [sim.expected_output(i) for i in range(40)]
    lengths = sorted(len(output.split()) for output in results.values())
    assert lengths[-1] > 3 * lengths[20]


async def test_accounting_over_http_endpoints(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    messages, _ = packed(["a", "b", "c"])
    await client.chat.completions.create(model=MODEL, messages=messages)
    sim.inject("server_error")
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    transport = httpx2.ASGITransport(app=sim)
    async with httpx2.AsyncClient(transport=transport, base_url="http://sim") as http:
        root = await http.get("/")
        assert root.status_code == 200
        assert root.json()["status"] == "ok"
        stats = (await http.get("/_sim/stats")).json()
        assert stats["totals"] == sim.statistics()._asdict()
        assert stats["totals"]["requests"] == 2
        assert stats["totals"]["items"] == 4
        assert stats["totals"]["errors"] == 1
        assert stats["totals"]["faults"] == 1
        assert [r["status"] for r in stats["requests"]] == [200, 500]
        assert (await http.post("/_sim/faults", json={"script": ["prose", None]})).json() == {
            "pending": 2
        }
        assert (await http.post("/_sim/faults", json={"script": ["nope"]})).status_code == 400
        assert (await http.post("/_sim/reset")).status_code == 200
        assert sim.statistics().requests == 0
        assert sim.faults.pending == 0
        assert (await http.get("/nowhere")).status_code == 404
        assert (await http.get("/v1/chat/completions")).status_code == 405
        bad = await http.post("/v1/chat/completions", content=b"{nope")
        assert bad.status_code == 400
        assert "not valid JSON" in bad.json()["error"]["message"]
    assert "requests=0" in repr(sim)

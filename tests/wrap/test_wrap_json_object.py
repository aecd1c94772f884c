"""``response_format={"type": "json_object"}`` (and the Responses API's ``json_object``
text format), and litellm's ``post``: read as calls whose answer is any JSON object,
packed with the reply's frame spelled out in the prompt, each answer checked as an
object and asked again (alone in the end) when it is not."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from _wrapping import SCHEMA, chat, gather
from openai.types.chat import ChatCompletion

from coalesce._wrap import wrap
from coalesce._wrap.openai_chat import openai_create_call, posted_create
from coalesce._wrap.openai_responses import responses_create_call
from coalesce.testing import SimulatedProvider

JSON_OBJECT = {"type": "json_object"}
#: Instructions that spell out the answer's schema, as instructor's JSON mode does.
SPELLED = {
    "role": "system",
    "content": f"Classify the mail. Answer by this schema: {json.dumps(SCHEMA)}",
}


def test_json_object_is_any_object_asked_in_the_prompt() -> None:
    call = openai_create_call(chat("x", system=SPELLED, response_format=JSON_OBJECT))
    assert call is not None
    assert call.output_schema == {"type": "object"}
    assert call.prompted
    assert call.options["response_format"] == JSON_OBJECT  # sent with the packed request
    assert json.dumps(SCHEMA) in call.instructions
    schema_call = openai_create_call(
        chat(
            "x",
            system=SPELLED,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "o", "schema": {"type": "object"}},
            },
        )
    )
    text_call = openai_create_call(chat("x", system=SPELLED))
    assert schema_call is not None
    assert text_call is not None
    assert len({call.key, schema_call.key, text_call.key}) == 3
    assert not schema_call.prompted


def test_responses_json_object_is_the_same_kind_of_call_as_chat() -> None:
    responses = responses_create_call(
        {
            "model": "gpt-4o-mini",
            "instructions": SPELLED["content"],
            "input": "x",
            "text": {"format": JSON_OBJECT},
        }
    )
    chat_call = openai_create_call(chat("x", system=SPELLED, response_format=JSON_OBJECT))
    assert responses is not None
    assert chat_call is not None
    assert responses.prompted
    assert responses.key == chat_call.key


@pytest.mark.anyio
async def test_json_object_calls_pack_and_answer_by_the_spelled_out_schema() -> None:
    sim = SimulatedProvider()
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:
        replies = await gather(
            8,
            lambda i: client.chat.completions.create(
                **chat(f"mail {i}", system=SPELLED, response_format=JSON_OBJECT)
            ),
        )
    assert [r.items for r in sim.requests] == [4, 4]
    for i, reply in enumerate(replies):
        assert isinstance(reply, ChatCompletion)
        assert json.loads(reply.choices[0].message.content or "") == sim.expected_output(
            f"mail {i}", SCHEMA
        )


@pytest.mark.anyio
async def test_an_answer_that_is_not_an_object_is_asked_again_alone() -> None:
    # Instructions that spell out a string: packed, the model writes each item's string,
    # which is no JSON object; alone, JSON mode makes it write an object.
    rating = {"type": "string", "enum": ["spam", "ham"]}
    system = {"role": "system", "content": f"Rate the mail by this schema: {json.dumps(rating)}"}
    sim = SimulatedProvider()
    async with wrap(
        sim.openai_client(max_retries=0), max_items=2, max_wait=1.0, packing="always"
    ) as client:
        replies = await gather(
            2,
            lambda i: client.chat.completions.create(
                **chat(f"mail {i}", system=system, response_format=JSON_OBJECT)
            ),
        )
    assert [r.items for r in sim.requests] == [2, 1, 1]
    for i, reply in enumerate(replies):
        answer = json.loads(reply.choices[0].message.content or "")
        assert answer == {"output": sim.expected_output(f"mail {i}", rating)}


def _posted(**body: Any) -> dict[str, Any]:
    return {
        "cast_to": ChatCompletion,
        "body": {"model": "gpt-4o-mini", "messages": [], **body},
        "options": {
            "headers": {"X-Stainless-Raw-Response": "true"},
            "extra_json": {},
            "timeout": 600.0,
            "security": {"bearer_auth": True},
        },
        "stream": bool(body.get("stream")),
    }


def test_a_posted_chat_completion_is_read_as_create() -> None:
    create = posted_create("/chat/completions", _posted(response_format=JSON_OBJECT))
    assert create == {
        "model": "gpt-4o-mini",
        "messages": [],
        "response_format": JSON_OBJECT,
        "extra_headers": {"X-Stainless-Raw-Response": "true"},
        "extra_body": {},
        "timeout": 600.0,
    }


@pytest.mark.parametrize(
    "posted",
    [
        {**_posted(), "cast_to": dict},
        _posted(not_an_argument=1),
        {**_posted(), "stream": True},  # the body says otherwise
        {**_posted(), "files": [("f", b"x")]},
        {**_posted(), "options": {"idempotency_key": "k"}},
        {**_posted(), "options": {"security": {"api_key": True}}},
        {**_posted(), "body": b"{}"},
    ],
)
def test_other_posts_are_the_sdks_own(posted: dict[str, Any]) -> None:
    assert posted_create("/chat/completions", posted) is None


def test_other_paths_are_the_sdks_own() -> None:
    assert posted_create("/embeddings", _posted()) is None


@pytest.mark.anyio
async def test_post_coalesces_and_answers_with_the_raw_response() -> None:
    sim = SimulatedProvider()
    rf = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:

        async def one(i: int) -> Any:
            posted = _posted(**chat(f"mail {i}", response_format=rf))
            return await client.post("/chat/completions", **posted)

        raws = await gather(4, one)
    assert [r.items for r in sim.requests] == [4]
    for i, raw in enumerate(raws):
        assert isinstance(raw, openai._legacy_response.LegacyAPIResponse)
        reply = raw.parse()
        assert isinstance(reply, ChatCompletion)
        assert json.loads(reply.choices[0].message.content or "") == sim.expected_output(
            f"mail {i}", SCHEMA
        )

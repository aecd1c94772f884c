"""A call whose format is asked in its prompt: the schema its instructions spell out
sizes the first groups (``coalesce._wrap.spelled``)."""

from __future__ import annotations

import json
from typing import Literal

import anyio
import pytest
from pydantic import BaseModel

from coalesce import wrap
from coalesce._planning.tokens import CharacterEstimator
from coalesce._wrap.spelled import spelled_output_tokens, spelled_schema
from coalesce.testing import SimulatedProvider


class Verdict(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    sarcastic: bool


SCHEMA = Verdict.model_json_schema()
INSTRUCTIONS = (
    "You label product reviews. " * 40
    + "\nAnswer with a JSON object matching this schema: "
    + json.dumps(SCHEMA)
)


def test_the_schema_spelled_out_in_the_instructions_is_found() -> None:
    assert spelled_schema(INSTRUCTIONS) == SCHEMA
    # Braces that are not a schema are skipped; the first object with properties wins.
    text = 'Fill {name} in. Example: {"a": 1}. Schema: ' + json.dumps(SCHEMA) + " {x"
    assert spelled_schema(text) == SCHEMA
    assert spelled_schema("no schema here {not json} {}") is None


def test_a_bounded_spelled_schema_gives_the_answers_size() -> None:
    estimator = CharacterEstimator()
    tokens = spelled_output_tokens(INSTRUCTIONS, estimator)
    longest = '{"label":"positive","sarcastic":false}'
    assert tokens is not None
    assert tokens >= estimator.count(longest)
    free = {"type": "object", "properties": {"summary": {"type": "string"}}}
    assert spelled_output_tokens("Schema: " + json.dumps(free), estimator) is None
    assert spelled_output_tokens("Answer in JSON.", estimator) is None


@pytest.mark.anyio
async def test_json_mode_calls_with_a_spelled_schema_pack_from_the_first_burst() -> None:
    # Without the spelled schema, a JSON-mode answer is guessed at 50 tokens and the
    # first burst goes out in groups of 4 (10 requests for 40 calls).
    sim = SimulatedProvider()
    reviews = [f"review {index}: it broke after a day, great job" for index in range(40)]
    answers: dict[int, str] = {}
    async with wrap(sim.openai_client(max_retries=0), latency_budget=5.0, max_items=20) as client:

        async def one(index: int) -> None:
            reply = await client.chat.completions.create(
                model="gpt-4o-mini",
                response_format={"type": "json_object"},
                messages=[
                    {"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": reviews[index]},
                ],
            )
            answers[index] = str(reply.choices[0].message.content)

        async with anyio.create_task_group() as tg:
            for index in range(len(reviews)):
                tg.start_soon(one, index)
    assert all(Verdict.model_validate_json(answers[i]) for i in range(len(reviews)))
    assert len(sim.requests) <= 5, [r.items for r in sim.requests]

"""The pure parts of what frameworks send, by hand and without an event loop: which
function a request forces, which schema its text describes, and that a Responses
request and the Chat Completions request saying the same thing get the same answer."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from coalesce._wire.packing import pack_request
from coalesce.testing import expected_output
from coalesce.testing._anthropic import ANTHROPIC
from coalesce.testing._engine import Answer, Prompt, compose
from coalesce.testing._faults import Fault
from coalesce.testing._http import HttpError
from coalesce.testing._openai import OPENAI
from coalesce.testing._responses import RESPONSES
from coalesce.testing._tokens import count_text
from coalesce.testing._tools import ForcedTool, described_schema, forced_function

SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
    "required": ["label", "n"],
}
OTHER = {"type": "object", "properties": {"x": {"type": "boolean"}}}


def answer(prompt: Prompt, faults: frozenset[Fault] = frozenset()) -> Answer:
    return compose(prompt, faults, lengths=None, rng=random.Random(0), count=count_text)


def chat_tools(choice: Any) -> dict[str, Any]:
    tools = [
        {"type": "function", "function": {"name": "a", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": "b", "parameters": OTHER}},
    ]
    return {"tools": tools, "tool_choice": choice}


def flat_tools(choice: Any) -> dict[str, Any]:
    tools = [
        {"type": "web_search"},
        {"type": "function", "name": "a", "parameters": SCHEMA},
        {"type": "function", "name": "b"},
    ]
    return {"tools": tools, "tool_choice": choice}


def test_forced_function_in_chats_nested_shape() -> None:
    assert forced_function(chat_tools("required"), nested=True) == ForcedTool("a", SCHEMA)
    named = chat_tools({"type": "function", "function": {"name": "b"}})
    assert forced_function(named, nested=True) == ForcedTool("b", OTHER)
    for choice in ("auto", "none", None):
        assert forced_function(chat_tools(choice), nested=True) is None
    assert forced_function({"messages": []}, nested=True) is None


def test_forced_function_in_the_responses_flat_shape() -> None:
    # Built-in tools are not functions: "required" forces the first function.
    assert forced_function(flat_tools("required"), nested=False) == ForcedTool("a", SCHEMA)
    named = flat_tools({"type": "function", "name": "b"})
    assert forced_function(named, nested=False) == ForcedTool("b", None)
    assert forced_function(flat_tools("auto"), nested=False) is None


def test_forced_function_refuses_what_cannot_be_forced() -> None:
    with pytest.raises(HttpError, match="'c'"):
        forced_function(chat_tools({"type": "function", "function": {"name": "c"}}), nested=True)
    with pytest.raises(HttpError, match="required"):
        forced_function(
            {"tools": [{"type": "web_search"}], "tool_choice": "required"}, nested=False
        )


def test_described_schema_is_the_first_schema_in_the_text() -> None:
    system = f'Answer like {{"label": "a"}}, valid against {json.dumps(SCHEMA, indent=2)}.'
    assert described_schema([system, "question"], ["question"]) == SCHEMA
    # The outer schema, not one of its properties.
    nested = {"type": "object", "properties": {"inner": SCHEMA}}
    assert described_schema([json.dumps(nested)], []) == nested
    assert described_schema(['Reply as {"label": "a"}.', "q"], ["q"]) is None
    assert described_schema(["{not json", "q"], ["q"]) is None


def test_described_schema_never_reads_packed_items() -> None:
    items = json.dumps([{"id": "1", "input": SCHEMA}])
    assert described_schema(["Do it.", items], [items]) is None
    # A plain question that holds a schema is read.
    question = f"Answer as {json.dumps(SCHEMA)}"
    assert described_schema(["Do it.", question], [question]) == SCHEMA


def test_json_object_answers_the_described_schema() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"Use this JSON schema: {json.dumps(SCHEMA)}"},
            {"role": "user", "content": "q"},
        ],
        "response_format": {"type": "json_object"},
    }
    prompt = OPENAI.parse(body)
    assert prompt.described == SCHEMA
    assert prompt.schema is None
    assert json.loads(answer(prompt).text) == expected_output("q", SCHEMA)
    # Told about the schema only, the model writes spaced JSON.
    assert ": " in answer(prompt).text
    # Asked for text, a model told to answer by a schema still does.
    plain = OPENAI.parse({**body, "response_format": None})
    assert json.loads(answer(plain).text) == expected_output("q", SCHEMA)


def test_json_object_answers_unstructured_packed_items_per_item() -> None:
    request = pack_request("Tag.", ["x", "y"], SCHEMA, structured=False)
    prompt = OPENAI.parse(
        {"model": "m", "messages": request.messages(), "response_format": {"type": "json_object"}}
    )
    results = json.loads(answer(prompt).text)["results"]
    assert results == {"1": expected_output("x", SCHEMA), "2": expected_output("y", SCHEMA)}


def test_a_schema_that_allows_any_object_says_less_than_the_instructions() -> None:
    frame = 'Each output must be valid against this JSON schema: {"type": "object"}'
    assert described_schema([frame, json.dumps(SCHEMA), "q"], ["q"]) == SCHEMA
    assert described_schema([frame, "q"], ["q"]) == {"type": "object"}


def _packed_body(system: str, output: dict[str, Any], **body: Any) -> dict[str, Any]:
    request = pack_request(system, ["x", "y"], output)
    messages = request.messages()
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": request.reply_schema}}
    return {"model": "m", "messages": messages, "response_format": rf, **body}


def test_packed_items_of_any_object_answer_what_the_instructions_spell_out() -> None:
    told = OPENAI.parse(_packed_body(f"Tag by {json.dumps(SCHEMA)}", {"type": "object"}))
    results = json.loads(answer(told).text)["results"]
    assert results == {"1": expected_output("x", SCHEMA), "2": expected_output("y", SCHEMA)}
    # Told nothing of the shape: the object a JSON-mode call answers.
    free = OPENAI.parse(_packed_body("Tag.", {"type": "object"}))
    results = json.loads(answer(free).text)["results"]
    assert results == {"1": {"output": expected_output("x")}, "2": {"output": expected_output("y")}}


def test_text_told_a_schema_is_its_json_fenced_when_asked() -> None:
    system = {"role": "system", "content": f"Answer in JSON by {json.dumps(SCHEMA)}"}
    asked = "q\n\nReturn the correct JSON response within a ```json codeblock."
    fenced = OPENAI.parse({"model": "m", "messages": [system, {"role": "user", "content": asked}]})
    text = answer(fenced).text
    assert text.startswith("```json\n")
    assert text.endswith("\n```")
    assert json.loads(text[len("```json\n") : -len("\n```")]) == expected_output(asked, SCHEMA)
    # Packed, each item's text is that JSON (the item asks for the fence).
    packed = OPENAI.parse(_packed_body(system["content"], {"type": "string"}))
    results = json.loads(answer(packed).text)["results"]
    assert {k: json.loads(v) for k, v in results.items()} == {
        "1": expected_output("x", SCHEMA),
        "2": expected_output("y", SCHEMA),
    }


def test_a_forced_function_is_a_tool_answer() -> None:
    prompt = OPENAI.parse(
        {"model": "m", "messages": [{"role": "user", "content": "q"}], **chat_tools("required")}
    )
    assert (prompt.tool, prompt.schema) == ("a", SCHEMA)
    reply = answer(prompt)
    assert reply.tool_input == expected_output("q", SCHEMA)
    assert reply.text == json.dumps(reply.tool_input, separators=(",", ":"))


@pytest.mark.parametrize(
    ("responses", "chat"),
    [
        (
            {"instructions": "Tag.", "input": "q"},
            {"messages": [{"role": "system", "content": "Tag."}, {"role": "user", "content": "q"}]},
        ),
        (
            {
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "q"}]}],
                "text": {"format": {"type": "json_schema", "name": "t", "schema": SCHEMA}},
            },
            {
                "messages": [{"role": "user", "content": "q"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "t", "schema": SCHEMA},
                },
            },
        ),
    ],
    ids=["text", "json_schema"],
)
def test_responses_and_chat_saying_the_same_get_the_same_answer(
    responses: dict[str, Any], chat: dict[str, Any]
) -> None:
    mine = RESPONSES.parse({"model": "m", **responses})
    theirs = OPENAI.parse({"model": "m", **chat})
    assert mine.texts == theirs.texts
    assert (mine.user_parts, mine.schema, mine.messages) == (
        theirs.user_parts,
        theirs.schema,
        theirs.messages,
    )
    assert answer(mine) == answer(theirs)


def test_responses_forced_function_and_limits() -> None:
    prompt = RESPONSES.parse(
        {"model": "m", "input": "q", "max_output_tokens": 30, **flat_tools("required")}
    )
    assert (prompt.tool, prompt.schema, prompt.max_tokens) == ("a", SCHEMA, 30)
    with pytest.raises(HttpError, match="input"):
        RESPONSES.parse({"model": "m"})
    with pytest.raises(HttpError, match="input"):
        RESPONSES.parse({"model": "m", "input": [1]})


def test_anthropic_output_config_is_the_answers_schema() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "q"}],
        "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
    }
    prompt = ANTHROPIC.parse(body)
    assert (prompt.schema, prompt.tool) == (SCHEMA, None)
    assert json.dumps(SCHEMA) in prompt.texts
    reply = answer(prompt)
    assert reply.tool_input is None
    assert reply.text == json.dumps(expected_output("q", SCHEMA), separators=(",", ":"))
    # The beta's older field says the same.
    beta = {**body, "output_config": None, "output_format": body["output_config"]["format"]}
    assert ANTHROPIC.parse(beta).schema == SCHEMA
    with pytest.raises(HttpError, match="output_config"):
        ANTHROPIC.parse({**body, "output_config": {"format": {"type": "json_schema"}}})

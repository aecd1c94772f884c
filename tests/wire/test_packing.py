"""Wire format 2 (and format 1 replies): builders and the complete-reply split (pure;
no event loop)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coalesce._exceptions import (
    ConfigurationError,
    InvalidOutputError,
    MissingOutputError,
    TruncatedOutputError,
)
from coalesce._wire.jsonstream import ResultScanner
from coalesce._wire.outcomes import (
    FailureKind,
    ItemFailure,
    Split,
    failure_error,
    read_result,
    read_whole,
)
from coalesce._wire.packing import (
    format_instructions,
    make_ids,
    pack_items,
    pack_request,
    split_reply,
)
from coalesce._wire.schema import build_reply_schema
from coalesce.providers._shapes import anthropic_tool, openai_response_format, strict_openai_schema

NASTY = [
    'he said "hi"',
    "{}",
    "]}",
    '"}]}',
    "line\nbreak\ttab",
    "\\",
    "\u00e9\u2603\U0001f600",
    "\\u0041",
]


class Address(pydantic.BaseModel):
    city: str
    zip: str | None = None


class Person(pydantic.BaseModel):
    name: str
    home: Address
    past: list[Address] = []


class Node(pydantic.BaseModel):
    label: str
    children: list[Node] = []


def resolve(root: dict[str, Any], ref: str) -> Any:
    node: Any = root
    for part in ref.removeprefix("#/").split("/") if ref != "#" else []:
        node = node[part]
    return node


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in refs(value)]
    return []


def objects(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        own = [node] if node.get("type") == "object" else []
        return own + [o for value in node.values() for o in objects(value)]
    if isinstance(node, list):
        return [o for value in node for o in objects(value)]
    return []


# --- builders -----------------------------------------------------------------------


def test_ids_are_one_to_n() -> None:
    assert make_ids(3) == ("1", "2", "3")


@pytest.mark.parametrize("text", NASTY)
def test_pack_items_round_trips_nasty_content(text: str) -> None:
    user = pack_items([("1", text), ("2", {"k": [text, text]})])
    assert json.loads(user) == [
        {"id": "1", "input": text},
        {"id": "2", "input": {"k": [text, text]}},
    ]


def test_pack_items_keeps_unicode_unescaped() -> None:
    assert "\u2603" in pack_items([("1", "\u2603")])


def test_pack_items_dumps_pydantic_models() -> None:
    person = Person(name="a", home=Address(city="b"))
    assert json.loads(pack_items([("1", person)]))[0]["input"] == person.model_dump(mode="json")


@pytest.mark.parametrize(
    "items", [[("1", 1), ("1", 2)], [("1", object())], [("1", float("nan"))], [(1, 1)]]
)
def test_pack_items_rejects_bad_ids_and_inputs(items: Any) -> None:
    with pytest.raises(ConfigurationError):
        pack_items(items)


def output_of(schema: dict[str, Any]) -> dict[str, Any]:
    """The output schema one result of a reply schema refers to."""
    results = schema["properties"]["results"]
    entry = next(iter(results["properties"].values()), None) if "properties" in results else None
    ref = (entry or results["additionalProperties"])["$ref"]
    found: dict[str, Any] = resolve(schema, ref)
    return found


def test_reply_schema_hoists_defs_and_refs_resolve() -> None:
    schema = build_reply_schema(Person.model_json_schema(), make_ids(2), pin=True)
    assert set(schema["$defs"]) == {"Address", "Output"}
    output = output_of(schema)
    assert "$defs" not in output
    assert output["properties"]["home"] == {"$ref": "#/$defs/Address"}
    assert refs(schema)
    for ref in refs(schema):
        assert isinstance(resolve(schema, ref), dict)


def test_reply_schema_recursive_model() -> None:
    schema = build_reply_schema(Node.model_json_schema(), None, pin=False)
    node = resolve(schema, output_of(schema)["$ref"])
    assert node["properties"]["label"] == {"type": "string"}  # "Label" only repeated the name
    assert resolve(schema, node["properties"]["children"]["items"]["$ref"]) is node


class Titled(pydantic.BaseModel):
    max_items: int
    title: str
    other: int = pydantic.Field(title="Something else")
    nested: list[Address | None] = []


def test_reply_schema_leaves_out_titles_that_repeat_a_name() -> None:
    schema = build_reply_schema(Titled.model_json_schema(), ["1"])
    output = schema["$defs"]["Output"]
    assert output["title"] == "Titled"  # the model's name says something
    fields = output["properties"]
    assert set(fields) == {"max_items", "title", "other", "nested"}  # no field is lost
    assert "title" not in fields["max_items"]  # "Max Items"
    assert "title" not in fields["title"]  # "Title"
    assert fields["other"]["title"] == "Something else"
    assert "title" not in schema["$defs"]["Address"]  # "Address", its $defs key
    assert "title" not in schema["$defs"]["Address"]["properties"]["city"]
    assert strict_openai_schema(schema)["$defs"]["Output"]["required"] == list(fields)


def test_reply_schema_output_name_does_not_clash() -> None:
    source = {"$ref": "#/$defs/Output", "$defs": {"Output": {"type": "integer"}}}
    schema = build_reply_schema(source, ["1"], pin=True)
    assert set(schema["$defs"]) == {"Output", "Output1"}
    assert schema["properties"]["results"]["properties"]["1"] == {"$ref": "#/$defs/Output1"}
    assert resolve(schema, output_of(schema)["$ref"]) == {"type": "integer"}


def test_reply_schema_rewrites_root_and_definitions_refs() -> None:
    legacy = {
        "type": "object",
        "properties": {
            "self": {"$ref": "#"},
            "a": {"$ref": "#/definitions/A"},
            "b": {"$ref": "#/properties/a"},
        },
        "definitions": {"A": {"type": "integer"}},
    }
    schema = build_reply_schema(legacy, None, pin=False)
    output = output_of(schema)
    assert resolve(schema, output["properties"]["self"]["$ref"]) is output
    assert resolve(schema, output["properties"]["a"]["$ref"]) == {"type": "integer"}
    assert resolve(schema, output["properties"]["b"]["$ref"]) == {"$ref": "#/$defs/A"}


def test_reply_schema_pins_every_id_as_a_required_key_in_order() -> None:
    schema = build_reply_schema({"type": "integer"}, ["1", "2", "3"], pin=True)
    results = schema["properties"]["results"]
    assert results["type"] == "object"
    assert list(results["properties"]) == results["required"] == ["1", "2", "3"]
    assert results["additionalProperties"] is False
    assert all(p == {"$ref": "#/$defs/Output"} for p in results["properties"].values())
    assert schema["required"] == ["results"]
    assert schema["$defs"]["Output"] == {"type": "integer"}


def test_reply_schema_unpinned_is_the_same_for_any_request() -> None:
    schema = build_reply_schema({"type": "integer"}, ["1"], pin=False)
    assert schema == build_reply_schema({"type": "integer"}, None, pin=False)
    results = schema["properties"]["results"]
    assert "properties" not in results
    assert results["additionalProperties"] == {"$ref": "#/$defs/Output"}


def test_reply_schema_format_one_pins_ids_and_count() -> None:
    schema = build_reply_schema({"type": "integer"}, ["1", "2", "3"], pin=True, keyed=False)
    results = schema["properties"]["results"]
    assert results["minItems"] == results["maxItems"] == 3
    assert results["items"]["properties"]["id"] == {"type": "string", "enum": ["1", "2", "3"]}
    assert results["items"]["properties"]["output"] == {"$ref": "#/$defs/Output"}
    assert results["items"]["required"] == ["id", "output"]
    loose = build_reply_schema({"type": "integer"}, None, pin=False, keyed=False)
    assert "minItems" not in loose["properties"]["results"]
    assert "enum" not in loose["properties"]["results"]["items"]["properties"]["id"]
    request = pack_request("Classify.", ["a"], {"type": "integer"}, structured=False, keyed=False)
    assert '{"results": [{"id": <the item' in request.system
    assert request.reply_schema["properties"]["results"]["type"] == "array"


def test_reply_schema_pin_needs_ids() -> None:
    with pytest.raises(ConfigurationError):
        build_reply_schema({"type": "integer"}, None, pin=True)


def test_strict_schema_closes_every_object_and_requires_all() -> None:
    source = build_reply_schema(Person.model_json_schema(), make_ids(1), pin=True)
    before = json.dumps(source, sort_keys=True)
    strict = strict_openai_schema(source)
    assert json.dumps(source, sort_keys=True) == before  # input untouched
    found = objects(strict)
    assert len(found) >= 4
    for obj in found:
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])
    assert "default" not in json.dumps(strict["$defs"]["Address"]["properties"]["zip"])


def test_strict_schema_inlines_ref_with_siblings() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A", "description": "d"}},
        "$defs": {"A": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    }
    a = strict_openai_schema(schema)["properties"]["a"]
    assert "$ref" not in a
    assert a["description"] == "d"
    assert a["additionalProperties"] is False
    assert a["required"] == ["x"]


def test_format_instructions_is_request_independent() -> None:
    structured = format_instructions()  # the reply schema spells out the shape
    assert '"id"' in structured
    assert "under its id" in structured
    assert "Each output" not in structured
    described = format_instructions({"type": "integer"})
    assert '{"results": {"<id>": <its output>' in described
    assert '"type": "integer"' in described
    assert len(structured) < len(described) / 2


def test_pack_request_caches_system_and_sends_exact_array() -> None:
    one = pack_request("Classify.", ["a"], {"type": "integer"})
    two = pack_request("Classify.", ["b", 'c"}]'], {"type": "integer"})
    assert one.system == two.system
    assert one.system.startswith("Classify.")
    assert two.ids == ("1", "2")
    decoded = json.loads(two.user)
    assert all(set(entry) == {"id", "input"} for entry in decoded)
    assert [e["input"] for e in decoded] == ["b", 'c"}]']
    assert two.messages() == [
        {"role": "system", "content": two.system},
        {"role": "user", "content": two.user},
    ]
    unstructured = pack_request("Classify.", ["a"], {"type": "integer"}, structured=False)
    assert "Each output" in unstructured.system


def test_pack_request_rejects_no_items() -> None:
    with pytest.raises(ConfigurationError):
        pack_request("x", [], {"type": "integer"})


def test_provider_shapes() -> None:
    schema = build_reply_schema(Person.model_json_schema(), make_ids(2), pin=True)
    fmt = openai_response_format(schema)
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["strict"] is True
    assert "$defs" in fmt["json_schema"]["schema"]
    assert anthropic_tool(schema)["input_schema"] == schema


# --- split_reply: examples -------------------------------------------------------------


def as_int(raw: Any) -> int:
    if type(raw) is not int:
        raise ValueError(f"not an int: {raw!r}")
    return raw


IDS = ("1", "2", "3")


def kinds(split: Split[Any]) -> dict[str, Any]:
    return {i: split.values[i] if i in split.values else split.failures[i].kind for i in split.ids}


@pytest.mark.parametrize(
    "text",
    [
        '{"results": [{"id": "3", "output": 30}, {"id": "1", "output": 10}, {"id": "2", "output": 20}]}',
        'Sure {here it is}:\n```json\n{"results": [{"id": 1, "output": 10}, {"output": 20, "id": "2"},'
        ' {"id": "3", "output": 30}]}\n```\nDone.',
        '[{"id": "2", "output": 20}, {"id": "1", "output": 10}, {"id": "3", "output": 30}]',
        '{"note": "]}", "data": {"results": [{"id": "1", "output": 10}, {"id": "2", "output": 20},'
        ' {"id": "3", "output": 30}]}}',
        '{"results":{"1":10,"2":20,"3":30}}',
        '{"results": {"3": 30, "1": 10, "2": 20}}',
        'Sure {here it is}:\n```json\n{"results": {\n  "2": 20,\n  "3": 30,\n  "1": 10\n}}\n```',
        '{"note": "}", "data": {"results": {"1": 10, "2": 20, "3": 30,},},}',
    ],
)
def test_split_maps_by_id_through_noise(text: str) -> None:
    split = split_reply(text, IDS, as_int)
    assert split.values == {"1": 10, "2": 20, "3": 30}
    assert split.ok
    assert not split.truncated


def test_split_fails_only_the_bad_items() -> None:
    text = json.dumps(
        {
            "results": [
                {"id": "1", "output": "ten"},
                {"id": "2", "output": 20},
                {"id": "9", "output": 30},
                {"id": "2", "output": 20},
            ]
        }
    )
    split = split_reply(text, IDS, as_int)
    assert kinds(split) == {"1": FailureKind.INVALID, "2": 20, "3": FailureKind.MISSING}
    assert split.failures["1"].raw == "ten"
    assert "not an int" in split.failures["1"].error
    assert split.unknown_ids == ("9",)


def test_split_keyed_outputs_of_every_json_type() -> None:
    outputs = {"1": 'a "}]} \\ \u00e9', "2": None, "3": -1.5e3, "4": [1, {"x": "]"}], "5": True}
    text = json.dumps({"results": outputs})
    split = split_reply(text, list(outputs), lambda raw: raw)
    assert split.values == outputs
    assert split.ok


def test_split_keyed_bad_values_fail_only_their_own_id() -> None:
    text = '{"results": {"1": "ten", "2": 20, "9": 30, "3": {oops}, "4": tru, "5": 5}}'
    split = split_reply(text, ["1", "2", "3", "4", "5", "6"], as_int)
    assert kinds(split) == {
        "1": FailureKind.INVALID,
        "2": 20,
        "3": FailureKind.INVALID,  # captured, but not JSON
        "4": FailureKind.INVALID,  # not a JSON literal
        "5": 5,
        "6": FailureKind.MISSING,
    }
    assert split.failures["3"].raw == "{oops}"
    assert split.failures["4"].raw == "tru"
    assert split.unknown_ids == ("9",)


def test_split_keyed_object_without_the_results_wrapper() -> None:
    split = split_reply('Here: {"note": {"1": 7}, "2": 20, "1": 10, "9": 0}', ["1", "2"], as_int)
    assert split.values == {"1": 10, "2": 20}  # "note" is not an id: nothing inside it counts
    assert split.unknown_ids == ("9",)
    # A damaged wrapper ("{results{" for '{"results":{') leaves the object readable.
    split = split_reply('{results{"1":10,"2":20},', ["1", "2"], as_int)
    assert split.values == {"1": 10, "2": 20}
    nested = split_reply('{"data": {"1": 10}}', ["1"], as_int)  # only at top level
    assert nested.failures["1"].kind is FailureKind.MISSING


def test_split_keyed_duplicates_judged_like_format_one() -> None:
    text = '{"results": {"1": 1, "2": 2, "1": 5, "2": 2}}'  # a JSON parser keeps the last
    split = split_reply(text, ["1", "2"], as_int)
    assert kinds(split) == {"1": FailureKind.DUPLICATE, "2": 2}
    assert split.failures["1"].raw == [1, 5]


def test_split_keyed_salvages_before_a_cut() -> None:
    for text in ('{"results": {"2": 2, "1": 1, "3": 3', '{"results": {"2": 2, "1": 1, "3": "thr'):
        split = split_reply(text, IDS, lambda raw: raw)
        assert kinds(split) == {"1": 1, "2": 2, "3": FailureKind.TRUNCATED}
        assert split.truncated


def test_split_differing_duplicates_fail_that_id_only() -> None:
    text = '{"results": [{"id": "1", "output": 1}, {"id": "2", "output": 2}, {"id": "1", "output": 5}]}'
    split = split_reply(text, ["1", "2"], as_int)
    assert kinds(split) == {"1": FailureKind.DUPLICATE, "2": 2}
    assert split.failures["1"].raw == [1, 5]


def test_split_salvages_before_a_cut() -> None:
    text = '{"results": [{"id": "2", "output": 2}, {"id": "1", "output": 1}, {"id": "3", "outp'
    split = split_reply(text, IDS, as_int)
    assert kinds(split) == {"1": 1, "2": 2, "3": FailureKind.TRUNCATED}
    assert split.truncated  # evident from the text even without finish_reason


def test_split_truncated_flag_makes_absent_ids_truncated() -> None:
    split = split_reply('{"results": []}', ["1"], as_int, truncated=True)
    assert split.failures["1"].kind is FailureKind.TRUNCATED


def test_split_malformed_object_fails_its_own_id() -> None:
    text = '{"results": [{"id": "1", "output": tru}, {"id": "2", "output": 2}, {"output": "x", "id": "3" oops}]}'
    split = split_reply(text, IDS, as_int)
    assert kinds(split) == {"1": FailureKind.INVALID, "2": 2, "3": FailureKind.MISSING}


def test_split_tolerates_trailing_commas_and_echoed_items() -> None:
    text = (
        'You sent [{"id": "1", "input": "a"}, {"id": "2", "input": "b"}].\n'
        '{"results": [{"id": "1", "output": 1,}, {"id": "2", "output": 2},],}'
    )
    split = split_reply(text, ["1", "2"], as_int)
    assert split.values == {"1": 1, "2": 2}
    assert not split.truncated


def test_split_result_without_output_is_invalid() -> None:
    split = split_reply('{"results": [{"id": "1"}]}', ["1"], as_int)
    assert split.failures["1"].kind is FailureKind.INVALID


@pytest.mark.parametrize("text", ["", "I cannot help with that.", "{oops", '{"result": 1}'])
def test_split_no_results_at_all(text: str) -> None:
    split = split_reply(text, ["1"], as_int)
    assert split.failures["1"].kind is FailureKind.MISSING


def test_split_rejects_duplicate_requested_ids() -> None:
    with pytest.raises(ConfigurationError):
        split_reply("", ["1", "1"], as_int)


# --- re-ask plan and errors ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        (FailureKind.MISSING, MissingOutputError),
        (FailureKind.INVALID, InvalidOutputError),
        (FailureKind.DUPLICATE, InvalidOutputError),
        (FailureKind.TRUNCATED, TruncatedOutputError),
    ],
)
def test_failure_error(kind: FailureKind, cls: type[Exception]) -> None:
    error = failure_error("4", ItemFailure(kind, raw=[1], error="why"), attempts=2)
    assert type(error) is cls
    assert (error.item_id, error.raw, error.attempts) == ("4", [1], 2)
    assert str(error) == "why; gave up after 2 attempts"


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        ("Sorry.", " (the reply began: 'Sorry.')"),
        ("x" * 200, f" (the reply began: {'x' * 200!r})"),
        ("y" * 201, f" (the reply began: {'y' * 200!r}...)"),
        ("  \n", " (the reply was empty)"),
        (None, ""),
    ],
)
def test_failure_error_shows_the_start_of_the_reply(reply: str | None, shown: str) -> None:
    failure = ItemFailure(FailureKind.MISSING, None, "the reply had no result for this call", reply)
    error = failure_error("3", failure)
    assert str(error) == f"the reply had no result for this call{shown}; gave up after 1 attempt"
    assert error.item_id == "3"


def test_split_keeps_the_reply_for_missing_and_cut_ids_and_names_no_id() -> None:
    prose = "Here are my thoughts on each ticket. " * 3
    missing = split_reply(prose, IDS, as_int).failures
    assert {i: (f.kind, f.reply) for i, f in missing.items()} == dict.fromkeys(
        IDS, (FailureKind.MISSING, prose)
    )
    cut_text = '{"results": {"1": 10, "2": 2'
    cut = split_reply(cut_text, IDS, as_int).failures
    assert (cut["3"].kind, cut["3"].reply) == (FailureKind.TRUNCATED, cut_text)
    twice = split_reply(
        '{"results": [{"id": "1", "output": 1}, {"id": "1", "output": 2}]}', IDS, as_int
    )
    errors = [f.error for f in [*missing.values(), cut["3"], twice.failures["1"]]]
    assert not [error for error in errors if "id " in error or "'1'" in error]
    assert (
        twice.failures["1"].error
        == "the reply gave 2 different outputs for this call; none is trusted"
    )


# --- split_reply: property ---------------------------------------------------------------
# Items carry a unique number k and a nasty string s; the right output for an item is
# {"v": 3k + 1, "echo": s}, so a value that reached the wrong caller is detectable.

nasty_text = st.text(
    alphabet=st.sampled_from([*'ab{}[]",:\\/ \n', "\u00e9", "\u2603", "\U0001f600", "\x00"]),
    max_size=6,
)


def expected(item: dict[str, Any]) -> tuple[int, str]:
    return 3 * item["k"] + 1, item["s"]


def validate(raw: Any) -> tuple[int, str]:
    if (
        not isinstance(raw, dict)
        or type(raw.get("v")) is not int
        or not isinstance(raw.get("echo"), str)
    ):
        raise ValueError("bad output")
    return raw["v"], raw["echo"]


@dataclass
class Case:
    inputs: dict[str, dict[str, Any]]
    text: str
    results: list[tuple[str, Any, int]]  # (id, raw output, end offset of its object)
    cut: int | None

    @property
    def sent(self) -> str:
        return self.text if self.cut is None else self.text[: self.cut]

    def seen(self) -> list[tuple[str, Any]]:
        limit = len(self.text) if self.cut is None else self.cut
        return [(i, raw) for i, raw, end in self.results if end <= limit]


def outputs_for(item: dict[str, Any]) -> st.SearchStrategy[Any]:
    v, s = expected(item)
    good = {"v": v, "echo": s}
    bad = st.sampled_from([{"v": "x", "echo": s}, '"}]oops', None, [v], {"echo": s}])
    return st.one_of(st.just(good), bad)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    ids = make_ids(draw(st.integers(1, 6)))
    inputs = {i: {"k": n, "s": draw(nasty_text)} for n, i in enumerate(ids)}
    entries: list[tuple[str, Any]] = []
    for i in ids:
        outputs = outputs_for(inputs[i])
        entries += [(i, draw(outputs)) for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2])))]
    for _ in range(draw(st.integers(0, 2))):
        entries.append((draw(st.sampled_from(["0", "99", "x", "1 ", "01"])), {"v": 1, "echo": ""}))
    entries = draw(st.permutations(entries))
    return render(draw, inputs, entries)


def render(draw: st.DrawFn, inputs: dict[str, Any], entries: list[tuple[str, Any]]) -> Case:
    if draw(st.booleans()):
        return render_keyed(draw, inputs, entries)
    space = st.sampled_from(["", " ", "\n  "])
    text = draw(st.sampled_from(["", "Here you go:\n", "```json\n", "Sure {see below} [1]:\n"]))
    bare = draw(st.booleans())
    text += "[" if bare else draw(st.sampled_from(['{"results": [', '{"note": "]}", "results":[']))
    results = []
    for n, (item_id, raw) in enumerate(entries):
        numeric = item_id.isdigit() and str(int(item_id)) == item_id
        wire_id: Any = int(item_id) if numeric and draw(st.booleans()) else item_id
        dumps = json.dumps(raw, ensure_ascii=draw(st.booleans()))
        pair = [f'"id":{draw(space)}{json.dumps(wire_id)}', f'"output":{draw(space)}{dumps}']
        pair = pair[::-1] if draw(st.booleans()) else pair
        text += ("," if n else "") + draw(space) + "{" + ", ".join(pair) + draw(space) + "}"
        results.append((item_id, raw, len(text)))
    text += draw(space) + ("]" if bare else "]}")
    text += draw(st.sampled_from(["", "\n```", "\nHope this helps {:}"]))
    cut = draw(st.one_of(st.none(), st.integers(0, len(text))))
    return Case(inputs, text, results, cut)


def render_keyed(draw: st.DrawFn, inputs: dict[str, Any], entries: list[tuple[str, Any]]) -> Case:
    """Format 2: ``{"results": {"<id>": <output>, ...}}``, duplicate keys and all."""
    space = st.sampled_from(["", " ", "\n  "])
    text = draw(st.sampled_from(["", "Here you go:\n", "```json\n", "Sure {see below} [1]:\n"]))
    text += draw(st.sampled_from(['{"results": {', '{"note": "]}", "results":{']))
    results = []
    for n, (item_id, raw) in enumerate(entries):
        key = json.dumps(item_id, ensure_ascii=draw(st.booleans()))
        dumps = json.dumps(raw, ensure_ascii=draw(st.booleans()))
        text += ("," if n else "") + draw(space) + key + ":" + draw(space) + dumps
        # A literal (null, a number) is complete only once the next character is seen.
        literal = not dumps.startswith(("{", "[", '"'))
        results.append((item_id, raw, len(text) + literal))
    text += draw(space) + "}}"
    text += draw(st.sampled_from(["", "\n```", "\nHope this helps {:}"]))
    cut = draw(st.one_of(st.none(), st.integers(0, len(text))))
    return Case(inputs, text, results, cut)


def fingerprint(raw: Any) -> str:
    return json.dumps(raw, sort_keys=True, ensure_ascii=False)


def oracle_all_occurrences(case: Case, item_id: str) -> Any:
    """split_reply's rule: one distinct output decides, several differing fail."""
    raws = [raw for i, raw in case.seen() if i == item_id]
    if not raws:
        return FailureKind.TRUNCATED if case.cut is not None else FailureKind.MISSING
    if len({fingerprint(r) for r in raws}) > 1:
        return FailureKind.DUPLICATE
    try:
        return validate(raws[0])
    except ValueError:
        return FailureKind.INVALID


@given(cases())
def test_split_property_each_item_gets_its_own_output_or_a_failure(case: Case) -> None:
    split = split_reply(case.sent, list(case.inputs), validate, truncated=case.cut is not None)
    assert set(split.values) | set(split.failures) == set(case.inputs)
    assert not set(split.values) & set(split.failures)
    for item_id, item in case.inputs.items():
        if item_id in split.values:
            assert split.values[item_id] == expected(item)  # never another's
        assert kinds(split)[item_id] == oracle_all_occurrences(case, item_id)
    unknown = [i for i, _ in case.seen() if i not in case.inputs]
    assert split.unknown_ids == tuple(dict.fromkeys(unknown))


# --- a well-formed reply read in one parse, as the scanner reads it ----------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "id", "output", "results"]), inner, max_size=3)
    ),
    max_leaves=6,
)
REPLY_IDS = ["1", "2", "3"]


def scanned(text: str, ids: list[str]) -> list[Any]:
    return [read_result(found) for found in ResultScanner(ids).feed(text)]


@given(
    st.lists(st.tuples(st.sampled_from(["1", "2", "3", "9", "x"]), JSON_VALUES), max_size=4),
    st.booleans(),
    st.sampled_from(["", " ", "\n\t"]),
)
def test_a_whole_reply_reads_as_the_scanner_reads_it(
    members: list[tuple[str, Any]], listed: bool, space: str
) -> None:
    """Format 2 (members keyed by id, any key given twice) and format 1 (result
    objects), written with odd spacing: wherever one parse reads the reply, it reads
    what the scanner finds in it."""
    if listed:
        body = ",".join(
            json.dumps({"id": key, "output": value} if key != "x" else value)
            for key, value in members
        )
        results = f"[{space}{body}{space}]"
    else:
        body = f",{space}".join(
            f"{json.dumps(key)}:{space}{json.dumps(value)}" for key, value in members
        )
        results = f"{{{space}{body}}}"
    text = f'{{{space}"results":{space}{results}{space}}}'
    whole = read_whole(text, REPLY_IDS)
    if whole is not None:
        assert whole == scanned(text, REPLY_IDS)
    keys = [key for key, _ in members]
    if not listed and len(set(keys)) == len(keys):
        assert whole is not None  # no key twice: one parse reads it


@pytest.mark.parametrize(
    "text",
    [
        '{"results": {"1": 1, "1": 2}}',  # an id twice: the scanner tells the duplicate
        'Sure! {"results": {"1": 1}}',  # prose around it
        '{"results": {"1": 1}, "note": {"results": {"2": 2}}}',  # results elsewhere too
        '{"1": 1, "2": 2}',  # the wrapper left out
        '{"results": {"1": 1}',  # cut
        '{"results": [1, {"id": "1", "output": 1}]}',  # not every result an object
        '{"results": {"1": {"a": 1, "a": 2}}}',  # a key twice inside an output
        '{"results": {"1": 1,}}',  # a trailing comma
    ],
)
def test_other_replies_are_left_to_the_scanner(text: str) -> None:
    assert read_whole(text, REPLY_IDS) is None


def test_an_id_named_results_is_left_to_the_scanner() -> None:
    assert read_whole('{"results": {"1": 1}}', ["1", "results"]) is None

"""Wire format 2: pack many callers' items into one prompt, split the reply back.

A packed request is two messages (see ``docs/protocol.md``):

* **system**: the user's shared instructions, then a description of the reply format.
  Both are the same for every request of one function, so provider prompt caching
  applies; nothing request-specific goes here.
* **user**: exactly ``json.dumps([{"id": "1", "input": ...}, ...], ensure_ascii=False,
  separators=(",", ":"))``.

Ids are ``"1"``, ``"2"``, ... ``"n"`` in request order (:func:`make_ids`): short, unique,
and a model that writes the number ``3`` for ``"3"`` still matches, since reply ids are
compared after ``str()``. They are never used as positions.

The reply is ``{"results": {"1": <output>, "2": <output>, ...}}``: each output keyed by
its item's id, requested with :func:`build_reply_schema` where the provider constrains
decoding. Format 1 replies (``{"results": [{"id": ..., "output": ...}, ...]}``) are
still read: the frame around each answer costs about 2 tokens in format 2 and 7 in
format 1, and output tokens are what a streamed caller waits for.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .._exceptions import ConfigurationError
from .jsonstream import ResultScanner
from .outcomes import (
    FailureKind,
    ItemFailure,
    Occurrence,
    Split,
    absent,
    check_ids,
    judge,
    ordered_unique,
    read_result,
)

T = TypeVar("T")

WIRE_VERSION = 2
"""The version of the packed request/reply format this module writes (it reads 1 too)."""

# The name under which the output schema sits in the reply schema's $defs, unless the
# output schema itself uses it (then a suffix is added).
_OUTPUT_DEF = "Output"


def make_ids(n: int) -> tuple[str, ...]:
    """The ids of a request of ``n`` items: ``"1"`` to ``str(n)``.

    Args:
        n: Number of items.
    """
    return tuple(str(i) for i in range(1, n + 1))


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def pack_items(items: Sequence[tuple[str, Any]]) -> str:
    """Encode ``(id, input)`` pairs as the user message of a packed request.

    Args:
        items: Pairs of an id (unique string) and a JSON-able input; pydantic models are
            dumped with ``model_dump(mode="json")``.

    Returns:
        ``[{"id":...,"input":...},...]`` as compact JSON (``ensure_ascii=False``), so
        no input's content can break the structure.

    Raises:
        ConfigurationError: The ids are not unique strings, or an input is not JSON-able.
    """
    check_ids(item_id for item_id, _ in items)
    return pack_value([{"id": item_id, "input": item} for item_id, item in items])


def pack_value(value: Any) -> str:
    """``value`` as compact JSON (``ensure_ascii=False``; pydantic models dumped).

    Raises:
        ConfigurationError: The value is not JSON-able (NaN and infinities included).
    """
    try:
        return json.dumps(
            value,
            ensure_ascii=False,
            allow_nan=False,
            default=_jsonable,
            separators=(",", ":"),  # compact: every space would be paid per item
        )
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"an item cannot be sent as JSON ({exc}); pass JSON-able values or pydantic models"
        ) from exc


def _move_ref(ref: str, pointer: str) -> str:
    if ref in ("#", "#/"):
        return pointer
    if ref.startswith("#/$defs/"):
        return ref
    if ref.startswith("#/definitions/"):
        return "#/$defs/" + ref[len("#/definitions/") :]
    if ref.startswith("#/"):
        return pointer + ref[1:]
    return ref  # not a local reference: nothing to move


def _rewrite_refs(node: Any, pointer: str) -> Any:
    if isinstance(node, dict):
        return {
            key: _move_ref(value, pointer)
            if key == "$ref" and isinstance(value, str)
            else _rewrite_refs(value, pointer)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(value, pointer) for value in node]
    return node


def _hoist(output_schema: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The output schema's definitions and the output schema itself, as one ``$defs``
    map (refs rewritten to point at the same places), and the output's name in it."""
    body = copy.deepcopy(dict(output_schema))
    body.pop("$schema", None)
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        for name, sub in (body.pop(key, None) or {}).items():
            if name in defs:
                raise ConfigurationError(
                    f"the output schema defines {name!r} in both $defs and definitions"
                )
            defs[name] = sub
    name, n = _OUTPUT_DEF, 1
    while name in defs:
        name, n = f"{_OUTPUT_DEF}{n}", n + 1
    defs = {key: _untitled(sub, key) for key, sub in defs.items()}
    defs[name] = _untitled(body, None)
    pointer = f"#/$defs/{name}"
    return name, {key: _rewrite_refs(sub, pointer) for key, sub in defs.items()}


def untitled_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` (and of its ``$defs``) without the titles that only repeat a
    field's name or a definition's key; see :func:`build_reply_schema`."""
    copied = copy.deepcopy(dict(schema))
    copied.pop("$schema", None)
    for key in ("$defs", "definitions"):
        if isinstance(copied.get(key), dict):
            copied[key] = {name: _untitled(sub, name) for name, sub in copied[key].items()}
    untitled: dict[str, Any] = _untitled(copied, None)
    return untitled


# Keywords whose value is one subschema, and those whose value is a list of them.
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_SUBSCHEMAS = ("anyOf", "allOf", "oneOf", "prefixItems")


def _untitled(node: Any, name: str | None) -> Any:
    """``node`` without the titles that only repeat a name the schema already gives.

    Pydantic titles every field after its name (``max_items``: ``"Max Items"``) and
    every model after its class, which is also its ``$defs`` key. A title is an
    annotation: it constrains nothing, and each one is paid as prompt tokens on every
    request. Titles that say something else (``Field(title=...)``) are kept.
    """
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str) and name is not None and _same(value, name):
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {field: _untitled(sub, field) for field, sub in value.items()}
        elif key in _SUBSCHEMA:
            out[key] = _untitled(value, None)
        elif key in _SUBSCHEMAS and isinstance(value, list):
            out[key] = [_untitled(sub, None) for sub in value]
        else:
            out[key] = value
    return out


def _same(title: str, name: str) -> bool:
    def squash(text: str) -> str:
        return "".join(c for c in text if c.isalnum()).casefold()

    return squash(title) == squash(name)


def build_reply_schema(
    output_schema: Mapping[str, Any],
    ids: Sequence[str] | None = None,
    *,
    pin: bool = True,
    keyed: bool = True,
) -> dict[str, Any]:
    """The JSON schema of a packed reply, ``{"results": {"1": <output>, ...}}``.

    The output schema goes into the root's ``$defs`` (as ``Output``, or ``Output1``...
    if the output schema already defines that name), beside its own ``$defs`` (and
    ``definitions``); every local ``$ref`` is rewritten to keep pointing at the same
    place, and each result refers to the output by ``$ref``. Titles that only repeat a
    field's name or a definition's key (pydantic's defaults) are left out: they
    constrain nothing and would be paid on every request.

    Args:
        output_schema: JSON schema of one item's output (e.g. ``TypeAdapter(Out).json_schema()``).
        ids: The request's ids; required when ``pin`` is true.
        pin: Name every id as a required property of ``results``, in request order, and
            allow no other (``additionalProperties: false``), so a constrained decoder
            writes each id exactly once. This is the form OpenAI's strict mode accepts.
            The schema then differs between group sizes, which costs prompt-cache hits
            where the provider caches the schema with the prompt. Unpinned,
            ``results`` is a map from any id to an output: the same schema for every
            request, but not accepted by OpenAI's strict mode (use ``strict=False``).
        keyed: Format 2 (outputs keyed by id). When false, format 1:
            ``{"results": [{"id": ..., "output": ...}, ...]}``, pinned with
            ``"id": {"enum": ids}`` and ``minItems = maxItems = len(ids)``. Format 1
            costs about 5 more output tokens per item, but a repeated id survives a
            provider that parses the reply before handing it over (Anthropic's tool
            input, when not streamed), where a repeated key would silently keep one value.

    Raises:
        ConfigurationError: ``pin`` without ids, or clashing definition names.
    """
    name, defs = _hoist(output_schema)
    output = {"$ref": f"#/$defs/{name}"}
    if pin and not ids:
        raise ConfigurationError("build_reply_schema(pin=True) needs the request's ids")
    pinned = check_ids(ids) if pin and ids else ()
    results: dict[str, Any]
    if not keyed:
        id_schema: dict[str, Any] = {"type": "string"}
        results = {"type": "array"}
        if pin:
            id_schema["enum"] = list(pinned)
            results["minItems"] = results["maxItems"] = len(pinned)
        results["items"] = _object({"id": id_schema, "output": output})
    elif pin:
        results = _object({item_id: dict(output) for item_id in pinned})
    else:
        results = {"type": "object", "additionalProperties": output}
    schema = _object({"results": results})
    schema["$defs"] = defs
    return schema


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def strict_openai_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` adapted to OpenAI's strict structured outputs.

    Every object gets ``additionalProperties: false`` (unless it sets its own) and all
    its properties required; ``default: null`` is dropped; a ``$ref`` with sibling keys
    is inlined. What strict mode cannot express is left as is and OpenAI rejects it (use
    ``strict=False`` then): free-form maps (``additionalProperties`` with a schema,
    e.g. ``dict[str, int]``), ``{}`` (any value), and ``oneOf``. Fields with defaults
    become required, so the model always writes them; validation still applies the
    output type's own rules.

    Args:
        schema: A JSON schema with ``$defs`` (if any) at its root.
    """
    root = copy.deepcopy(dict(schema))
    strict: dict[str, Any] = _strict(root, root)
    return strict


def _strict(node: Any, root: dict[str, Any]) -> Any:
    if not isinstance(node, dict):
        return node
    for key in ("$defs", "definitions"):
        if isinstance(node.get(key), dict):
            node[key] = {name: _strict(sub, root) for name, sub in node[key].items()}
    kinds = node.get("type")
    is_object = kinds == "object" or (isinstance(kinds, list) and "object" in kinds)
    if (is_object or "properties" in node) and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if isinstance(node.get("properties"), dict):
        node["required"] = list(node["properties"])
        node["properties"] = {k: _strict(v, root) for k, v in node["properties"].items()}
    if isinstance(node.get("items"), dict):
        node["items"] = _strict(node["items"], root)
    for key in ("anyOf", "allOf"):
        if isinstance(node.get(key), list):
            node[key] = [_strict(sub, root) for sub in node[key]]
    if "default" in node and node["default"] is None:
        del node["default"]
    if isinstance(node.get("$ref"), str) and len(node) > 1:
        target = _resolve(root, node.pop("$ref"))
        return _strict({**copy.deepcopy(target), **node}, root)
    return node


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/") if ref != "#" else []:
        node = node.get(part.replace("~1", "/").replace("~0", "~"))
    if not isinstance(node, dict):
        raise ConfigurationError(f"$ref {ref!r} does not resolve to a schema object")
    return node


def format_instructions(
    output_schema: Mapping[str, Any] | None = None, *, keyed: bool = True
) -> str:
    """The reply-format description that follows the instructions in the system message.

    It mentions no id and no count, so it is identical for every request of the same
    function and the provider's prompt cache keeps applying. When the provider enforces
    the reply schema (structured output), the schema already spells out the reply's
    shape, so the description is one sentence (it is paid on every request).

    Args:
        output_schema: Include this schema of one output, for providers without
            structured output; leave ``None`` when the provider enforces the reply schema.
        keyed: Describe format 2 (outputs keyed by id); when false, format 1.
    """
    items = (
        'The user message is a JSON array of items, each {"id", "input"}: '
        "apply the instructions above to each input on its own"
    )
    if output_schema is None:
        return f"{items} and give its output {'under' if keyed else 'with'} its id."
    shape = (
        '{"results": {"<id>": <its output>, ...}} with each item\'s id, copied exactly, '
        "as the key of its output, and each id exactly once."
        if keyed
        else '{"results": [{"id": <the item\'s id, copied exactly>, "output": <its output>},'
        " ...]} with exactly one result per item and each id exactly once."
    )
    text = (
        f"{items}.\nReply with one JSON object and nothing else (no prose, no code fence): {shape}"
    )
    schema = json.dumps(dict(output_schema), ensure_ascii=False, sort_keys=True)
    return f"{text}\nEach output must be valid against this JSON schema: {schema}"


@dataclass(frozen=True)
class PackedRequest:
    """One packed request, provider-neutral.

    Attributes:
        system: Instructions, then the reply-format description (cacheable prefix).
        user: The items as a JSON array of ``{"id", "input"}``.
        ids: The ids, in item order.
        reply_schema: The reply's JSON schema, ``$defs`` at the root.
    """

    system: str
    user: str
    ids: tuple[str, ...]
    reply_schema: Mapping[str, Any]

    def messages(self) -> list[dict[str, str]]:
        """Chat messages for OpenAI-style APIs (system first)."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


def pack_request(
    instructions: str,
    items: Sequence[Any],
    output_schema: Mapping[str, Any],
    *,
    structured: bool = True,
    pin: bool = True,
    keyed: bool = True,
) -> PackedRequest:
    """Pack items into one request, with ids ``"1"`` .. ``"n"`` in item order.

    Args:
        instructions: The shared task instructions (the per-item prompt's system part).
        items: JSON-able inputs (or pydantic models).
        output_schema: JSON schema of one item's output.
        structured: The provider enforces the reply schema; when false, the output
            schema is spelled out in the system message instead.
        pin: Pin ids and result count in the reply schema (see :func:`build_reply_schema`).
        keyed: Ask for format 2 (outputs keyed by id); false: format 1 (a list of
            ``{"id", "output"}``), see :func:`build_reply_schema`.

    Raises:
        ConfigurationError: No items, or an item is not JSON-able.
    """
    if not items:
        raise ConfigurationError("cannot pack a request of zero items")
    ids = make_ids(len(items))
    described = None if structured else output_schema
    system = f"{instructions.rstrip()}\n\n{format_instructions(described, keyed=keyed)}"
    user = pack_items(list(zip(ids, items, strict=True)))
    schema = build_reply_schema(output_schema, ids, pin=pin, keyed=keyed)
    return PackedRequest(system, user, ids, schema)


def openai_response_format(
    reply_schema: Mapping[str, Any], *, name: str = "coalesce_results", strict: bool = True
) -> dict[str, Any]:
    """The ``response_format`` argument of an OpenAI chat completion.

    Args:
        reply_schema: From :func:`build_reply_schema`.
        name: Schema name (letters, digits, ``_`` and ``-``, at most 64).
        strict: Ask for strict decoding; the schema goes through :func:`strict_openai_schema`.
    """
    schema = strict_openai_schema(reply_schema) if strict else dict(reply_schema)
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "strict": strict, "schema": schema},
    }


def anthropic_tool(
    reply_schema: Mapping[str, Any], *, name: str = "coalesce_results"
) -> dict[str, Any]:
    """An Anthropic tool whose input is the reply; force it with ``tool_choice``.

    Anthropic caches tools before the system prompt, so a pinned (per-size) schema here
    costs cache hits; an unpinned one (``pin=False``) keeps one tool for every request.

    Args:
        reply_schema: From :func:`build_reply_schema`.
        name: Tool name.
    """
    return {
        "name": name,
        "description": "Record the output for every item, one result per item id.",
        "input_schema": dict(reply_schema),
    }


def split_reply(
    text: str,
    ids: Sequence[str],
    validate: Callable[[Any], T],
    *,
    truncated: bool = False,
) -> Split[T]:
    """Split a complete reply back into one outcome per requested id.

    Tolerant: prose and code fences around the JSON are skipped, format 1 replies and
    bare top-level results (an array of result objects, or an object keyed by ids) are
    accepted, and every complete result before a cut is salvaged. Outputs are matched by id (after ``str()``), never by position. An id
    given identical outputs more than once counts once; differing outputs fail it as
    ``DUPLICATE``. Unknown ids resolve nobody.

    Args:
        text: The reply text (for a tool call, ``json.dumps`` of its input).
        ids: The request's ids.
        validate: Converts one raw output to the caller's type; any exception it raises
            marks the output invalid.
        truncated: The provider said the reply was cut off (``finish_reason: length``).

    Raises:
        ConfigurationError: The ids are not unique strings.
    """
    requested = check_ids(ids)
    found: dict[str, list[Occurrence]] = {item_id: [] for item_id in requested}
    unknown: list[str] = []
    scanner = ResultScanner(requested)
    for result in scanner.feed(text):
        occurrence = read_result(result)
        if occurrence is None:
            continue
        if occurrence.id in found:
            found[occurrence.id].append(occurrence)
        else:
            unknown.append(occurrence.id)
    cut = truncated or scanner.in_results
    values: dict[str, T] = {}
    failures: dict[str, ItemFailure] = {}
    for item_id, occurrences in found.items():
        ok, outcome = _decide(item_id, occurrences, validate, cut, text)
        if ok:
            values[item_id] = outcome
        else:
            failures[item_id] = outcome
    return Split(requested, values, failures, ordered_unique(unknown), cut)


def _decide(
    item_id: str,
    occurrences: list[Occurrence],
    validate: Callable[[Any], T],
    cut: bool,
    text: str,
) -> tuple[bool, Any]:
    if not occurrences:
        return False, absent(item_id, truncated=cut, reply=text)
    distinct = {o.fingerprint: o for o in occurrences}
    if len(distinct) > 1:
        raws = [o.raw for o in distinct.values()]
        error = f"the reply gave {len(raws)} different outputs for this call; none is trusted"
        return False, ItemFailure(FailureKind.DUPLICATE, raws, error)
    return judge(occurrences[0], validate)

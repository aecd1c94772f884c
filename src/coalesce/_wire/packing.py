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
its item's id, requested with :func:`~coalesce._wire.schema.build_reply_schema` where the provider constrains
decoding. Format 1 replies (``{"results": [{"id": ..., "output": ...}, ...]}``) are
still read: the frame around each answer costs about 2 tokens in format 2 and 7 in
format 1, and output tokens are what a streamed caller waits for.
"""

from __future__ import annotations

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
from .schema import build_reply_schema

T = TypeVar("T")

WIRE_VERSION = 2
"""The version of the packed request/reply format this module writes (it reads 1 too)."""


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
        pin: Pin ids and result count in the reply schema (see :func:`~coalesce._wire.schema.build_reply_schema`).
        keyed: Ask for format 2 (outputs keyed by id); false: format 1 (a list of
            ``{"id", "output"}``), see :func:`~coalesce._wire.schema.build_reply_schema`.

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

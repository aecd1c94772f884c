"""The provider-neutral core: from a parsed prompt and its faults to an answer.

Both API flavours parse their request into a :class:`Prompt`; :func:`compose` builds
the :class:`Answer` (deterministic outputs, item and text faults, truncation) without
any I/O, so it is tested without an event loop.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._cache import CacheRequest
from ._degradation import PackingDegradation, degrade_results
from ._faults import ITEM_FAULTS, Fault, damage_results, damage_text
from ._length import OutputTokens, target_tokens
from ._model import expected_output, free_text
from ._tools import any_object
from ._wire import PackedItem, item_output_schema, keyed_reply, parse_packed

__all__ = [
    "Answer",
    "Prompt",
    "ReplyContext",
    "compose",
    "cut_to_tokens",
    "prompt_tokens",
    "split_pieces",
]

Counter = Callable[[str], int]


@dataclass(frozen=True)
class Prompt:
    """One generation request, whatever the API.

    Attributes:
        model: The requested model.
        texts: Every text of the prompt (system, messages, schemas), for counting.
        user_parts: The text blocks of the last user message.
        schema: The schema the answer must follow, if any.
        json_mode: The answer must be JSON (OpenAI ``json_object``).
        described: The schema the prompt's text spells out, if any (a forced tool's
            request has none). The answer follows it where the request leaves the
            answer's shape open: no ``schema`` (JSON mode, or text: a model told to
            answer by a schema does, in a fenced ````json`` block when the prompt asks
            for one), or a ``schema`` (or a packed item's) that allows any object.
            Written as the model writes JSON it was only told about, with spaces.
        tool: The forced tool whose input (Anthropic) or arguments (OpenAI) are the
            answer, if any.
        max_tokens: The completion token limit, if any.
        stream: Whether the answer is streamed.
        messages: How many messages the prompt has.
        cache: What the request offers the prompt cache (nothing by default).
    """

    model: str
    texts: tuple[str, ...]
    user_parts: tuple[str, ...]
    schema: Mapping[str, Any] | None = None
    json_mode: bool = False
    tool: str | None = None
    described: Mapping[str, Any] | None = None
    max_tokens: int | None = None
    stream: bool = False
    messages: int = 1
    cache: CacheRequest = field(default_factory=CacheRequest)


@dataclass(frozen=True)
class Answer:
    """The simulated model's answer to one prompt.

    Attributes:
        text: The reply text (for a tool answer, its input as JSON).
        tool_input: The tool input, or ``None`` for a text reply.
        truncated: The reply was cut at ``max_tokens``.
        completion_tokens: Tokens of ``text``.
        items: Items answered (packed items, or 1).
        faults: The faults that changed the answer.
        degraded: Of ``items``, the answers a :class:`PackingDegradation` made wrong.
    """

    text: str
    tool_input: dict[str, Any] | None
    truncated: bool
    completion_tokens: int
    items: int
    faults: frozenset[Fault]
    degraded: int = 0


@dataclass(frozen=True)
class ReplyContext:
    """What a flavour needs besides the answer to render a reply.

    Attributes:
        id: The response id.
        created: Unix time of the response.
        prompt_tokens: Tokens of the prompt.
        prompt: The parsed request.
        body: The raw request body.
        cached_tokens: Of the prompt tokens, those read from the prompt cache.
        cache_write_tokens: Of the prompt tokens, those written to the cache (Anthropic).
    """

    id: str
    created: int
    prompt_tokens: int
    prompt: Prompt
    body: Mapping[str, Any]
    cached_tokens: int = 0
    cache_write_tokens: int = 0


def prompt_tokens(prompt: Prompt, count: Counter) -> int:
    """Return the prompt's tokens (each text as ``count`` counts it) plus a few per
    message, like the APIs."""
    return sum(count(text) for text in prompt.texts) + 3 * prompt.messages + 3


def _shaping_schema(prompt: Prompt) -> Mapping[str, Any] | None:
    """The schema the answer follows: the request's own, else the one its text describes."""
    return _told(prompt.schema if prompt.schema is not None else prompt.described, prompt)


def _told(schema: Mapping[str, Any] | None, prompt: Prompt) -> Mapping[str, Any] | None:
    """``schema``; where it allows any object, the schema the prompt's text spells out
    instead, if it spells out one that says more (a model reads its instructions)."""
    told = prompt.described
    if schema is not None and any_object(schema) and told is not None and not any_object(told):
        return told
    return schema


def _item_schema(prompt: Prompt) -> Mapping[str, Any] | None:
    """The schema of one packed item's output: from the reply schema, or (a described
    schema that is not a whole reply's) the described schema itself."""
    if prompt.schema is not None:
        return _told(item_output_schema(prompt.schema), prompt)
    if prompt.described is not None:
        return _told(item_output_schema(prompt.described) or dict(prompt.described), prompt)
    return None


def _fenced(text: str, prompt: Prompt) -> str:
    """``text`` in a ````json`` block when the prompt asks for one (instructor's MD_JSON)."""
    return f"```json\n{text}\n```" if any("```json" in t for t in prompt.texts) else text


def _item_output(
    item: PackedItem, schema: Mapping[str, Any] | None, prompt: Prompt, lengths: OutputTokens
) -> Any:
    """One packed item's answer. An output allowed to be any object is the unshaped
    answer as an object, as a plain JSON-mode call answers; an output of free text whose
    instructions spell out a schema is the JSON the model was told to write, as text."""
    tokens = target_tokens(lengths, item.input)
    if schema is not None and any_object(schema):
        return {"output": expected_output(item.input, output_tokens=tokens)}
    told = prompt.described
    if schema is not None and free_text(schema) and told is not None and not any_object(told):
        value = expected_output(item.input, told, output_tokens=tokens)
        return _fenced(json.dumps(value, ensure_ascii=False), prompt)
    return expected_output(item.input, schema, output_tokens=tokens)


def _packed_results(
    items: list[PackedItem],
    prompt: Prompt,
    lengths: OutputTokens,
    degradation: PackingDegradation | None,
) -> tuple[list[dict[str, Any]], int]:
    """Each item's answer, and how many of them ``degradation`` made wrong."""
    item_schema = _item_schema(prompt)
    results = [
        {"id": item.id, "output": _item_output(item, item_schema, prompt, lengths)}
        for item in items
    ]
    inputs = [item.input for item in items]
    return degrade_results(results, inputs, item_schema, degradation, lengths)


def _write_results(
    results: list[dict[str, Any]], keyed: bool, separators: tuple[str, str] | None
) -> tuple[str, dict[str, Any]]:
    """The reply text and its value. Keyed (format 2), the text is written member by
    member, so a fault's repeated id really appears twice; the value keeps the last."""
    if not keyed:
        value: dict[str, Any] = {"results": results}
        return json.dumps(value, ensure_ascii=False, separators=separators), value
    item, key = separators or (", ", ": ")

    def dumps(raw: Any) -> str:
        return json.dumps(raw, ensure_ascii=False, separators=separators)

    members = item.join(f"{dumps(r['id'])}{key}{dumps(r['output'])}" for r in results)
    value = {"results": {r["id"]: r["output"] for r in results}}
    return f'{{"results"{key}{{{members}}}}}', value


def _single_value(prompt: Prompt, lengths: OutputTokens) -> Any:
    question: Any = "".join(prompt.user_parts)
    if question.lstrip().startswith(("{", "[")):
        # An item sent as JSON (a plain call of one structured item) is that value.
        with contextlib.suppress(ValueError):
            question = json.loads(question)
    schema = _shaping_schema(prompt)
    free = schema is not None and any_object(schema)  # any object: its shape left open
    if free:
        schema = None
    inner = _answer_schema(schema)
    if inner is not None:  # a scalar asked for as {"answer": ...}: the same answer, wrapped
        tokens = target_tokens(lengths, question)
        return {"answer": expected_output(question, inner, output_tokens=tokens)}
    value = expected_output(question, schema, output_tokens=target_tokens(lengths, question))
    unshaped = (prompt.schema is None or free) and not isinstance(value, dict)
    if unshaped and (prompt.json_mode or prompt.tool is not None or free):
        return {"output": value}
    return value


def _answer_schema(schema: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The output schema inside a plain call's ``{"answer": ...}`` wrapper (coalesce asks
    for an output that is not an object this way), or ``None``."""
    if schema is None or schema.get("type") != "object":
        return None
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or list(properties) != ["answer"]:
        return None
    inner = dict(properties["answer"])
    if "$defs" in schema:
        inner["$defs"] = schema["$defs"]
    return inner


def cut_to_tokens(text: str, limit: int, count: Counter) -> str:
    """Return the longest prefix of ``text`` with at most ``limit`` tokens."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if count(text[:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _salvage(value: Any, kept: int) -> dict[str, Any]:
    """Return what a truncated tool input still holds: the results written in full."""
    results = value.get("results") if isinstance(value, dict) else None
    entries: list[Any]
    if isinstance(results, list):
        entries = results
    elif isinstance(results, dict):
        entries = list(results.items())
    else:
        return {}

    def first(n: int) -> dict[str, Any]:
        return {"results": entries[:n] if isinstance(results, list) else dict(entries[:n])}

    count = 0
    while count < len(entries) and len(json.dumps(first(count + 1))) - 2 <= kept:
        count += 1
    return first(count)


def compose(
    prompt: Prompt,
    faults: frozenset[Fault],
    *,
    lengths: OutputTokens,
    rng: random.Random,
    count: Counter,
    degradation: PackingDegradation | None = None,
) -> Answer:
    """Return the answer to ``prompt`` with ``faults`` applied.

    Args:
        prompt: The parsed request.
        faults: The faults drawn for this request (HTTP-level ones are ignored here).
        lengths: Target answer length per item.
        rng: Chooses which items the item faults hit.
        count: Counts tokens in the prompt's model.
        degradation: How packing worsens the answers to packed items (``None``: not).
    """
    items = parse_packed(prompt.user_parts)
    applied: frozenset[Fault] = frozenset()
    # Constrained by a schema, models write compact JSON (as OpenAI's structured outputs
    # and Anthropic's tool inputs do); asked in the prompt alone, they add spaces.
    compact = (",", ":") if prompt.schema is not None else None
    value: Any
    degraded = 0
    if items is not None:
        results, degraded = _packed_results(items, prompt, lengths, degradation)
        if faults & ITEM_FAULTS:
            results, applied = damage_results(results, faults, rng, _item_schema(prompt))
        keyed = keyed_reply(prompt.schema, prompt.texts)
        text, value = _write_results(results, keyed, compact)
    else:
        value = _single_value(prompt, lengths)
        plain = isinstance(value, str) and prompt.schema is None
        text = value if plain else json.dumps(value, ensure_ascii=False, separators=compact)
        if not plain and prompt.schema is None and not prompt.json_mode and prompt.tool is None:
            text = _fenced(text, prompt)  # told about a schema, asked for text
    tool_input: dict[str, Any] | None = None
    if prompt.tool is not None:
        tool_input = value if isinstance(value, dict) else {"output": value}
    text, damaged = damage_text(text, faults)
    if damaged:
        tool_input = None  # the model answered in prose instead of calling the tool
    tokens = count(text)
    limit = prompt.max_tokens
    if Fault.TRUNCATE in faults and tokens > 1:
        limit = min(limit if limit is not None else tokens, tokens // 2)
        damaged |= {Fault.TRUNCATE}
    truncated = limit is not None and tokens > limit
    if truncated and limit is not None:
        text = cut_to_tokens(text, limit, count)
        tokens = count(text)
        if tool_input is not None:
            tool_input = _salvage(value, len(text))
    return Answer(
        text, tool_input, truncated, tokens, len(items or [None]), applied | damaged, degraded
    )


def split_pieces(text: str, max_pieces: int = 64, min_words: int = 4) -> list[str]:
    """Split a reply into stream chunks of whole words and punctuation marks: at least
    ``min_words`` of them per chunk (about as many tokens; the last may have fewer, so
    a long reply does not cost the server one event per token), at most ``max_pieces``
    chunks."""
    # Words and punctuation, each with the spaces before it: compact JSON has no spaces
    # but streams in pieces all the same.
    words = re.findall(r"\s*(?:\w+|[^\w\s])|\s+", text)
    size = max(min_words, -(-len(words) // max_pieces))
    return ["".join(words[i : i + size]) for i in range(0, len(words), size)]

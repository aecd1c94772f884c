"""Whether a packed answer and a plain one agree, free text included. Pure.

Two right answers of free text seldom match word for word ("the Kindle Paperwhite" and
"Kindle Paperwhite."), so equality would judge packing by wording. The measure here
compares an answer part by part:

* enums, numbers, booleans and ``None`` exactly (as equality does);
* mappings (a pydantic model's fields) by key, every key in both, each value in turn;
  lists by position, of equal length;
* strings by their words: after normalising (Unicode NFKC, case folded, punctuation
  and the articles "a", "an", "the" dropped, whitespace collapsed), equal strings
  agree; otherwise their token F1 (the harmonic mean of the shared words' precision
  and recall, as SQuAD scores short answers) must exceed ``threshold``: two answers
  sharing half their words ("Kindle Paperwhite", "Kindle Oasis") are different ones;
* the schema's labels (``Literal`` and enum members, constants) exactly, wherever
  they appear.

The threshold separates "the same answer in other words" from "a different answer";
its default, :data:`TEXT_AGREEMENT`, and its error rates on real model answers are in
``docs/accuracy.md``. :func:`agreement_for` picks a function's comparison.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any

from .._planning.longest import has_free_text

__all__ = ["TEXT_AGREEMENT", "agreement_for", "answers_agree", "labels", "token_f1", "words"]

#: The token F1 above which two strings are the same answer in other words.
TEXT_AGREEMENT = 0.5

_WORD = re.compile(r"\w+")
_ARTICLES = frozenset({"a", "an", "the"})


def words(text: str) -> list[str]:
    """``text``'s words, normalised: NFKC, case folded, punctuation and articles out."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [word for word in _WORD.findall(folded) if word not in _ARTICLES]


def token_f1(first: str, second: str) -> float:
    """The token F1 of two strings' normalised words (1.0 when both have none)."""
    a, b = words(first), words(second)
    if not a or not b:
        return float(a == b)
    shared = sum((Counter(a) & Counter(b)).values())
    if not shared:
        return 0.0
    precision, recall = shared / len(a), shared / len(b)
    return 2 * precision * recall / (precision + recall)


def answers_agree(
    packed: Any, plain: Any, *, threshold: float = TEXT_AGREEMENT, exact: Collection[str] = ()
) -> bool:
    """Whether ``packed`` and ``plain`` are the same answer (see the module doc).

    Args:
        packed: The answer given in a packed request (a value, or a pydantic model).
        plain: The answer given alone.
        threshold: The token F1 two different strings must exceed.
        exact: Strings that are labels: one of them agrees only with itself.
    """
    a, b = _plain_data(packed), _plain_data(plain)
    agree = partial(answers_agree, threshold=threshold, exact=exact)
    if isinstance(a, str) and isinstance(b, str):
        return a == b or (a not in exact and b not in exact and token_f1(a, b) > threshold)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(agree(a[key], b[key]) for key in a)
    if _is_list(a) and _is_list(b):
        return len(a) == len(b) and all(agree(x, y) for x, y in zip(a, b, strict=True))
    return (type(a) is type(b) and bool(a == b)) or _same_number(a, b)


def _plain_data(value: Any) -> Any:
    """A pydantic model as its fields (by alias-free name); anything else as it is."""
    dump = getattr(value, "model_dump", None)
    return dump() if callable(dump) and not isinstance(value, type) else value


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _same_number(a: Any, b: Any) -> bool:
    """``1`` and ``1.0`` are one number (booleans are not numbers here)."""
    numbers = (int, float)
    return (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )


def labels(schema: Any) -> frozenset[str]:
    """Every string a schema lists as an ``enum`` member or a ``const``."""
    parts = schema.values() if isinstance(schema, Mapping) else schema
    if isinstance(schema, str) or not isinstance(parts, Collection):
        return frozenset()
    listed = schema.get("enum") if isinstance(schema, Mapping) else None
    found = {v for v in (listed if isinstance(listed, list) else []) if isinstance(v, str)}
    if isinstance(schema, Mapping) and isinstance(schema.get("const"), str):
        found.add(schema["const"])
    return frozenset(found).union(*map(labels, parts))


def agreement_for(
    schema: Mapping[str, Any], agree: Callable[[Any, Any], bool] | None
) -> Callable[[Any, Any], bool] | None:
    """How a function's packed and plain answers are compared: the user's ``agree``;
    else, for an output that may hold free text, :func:`answers_agree` (the schema's
    labels exactly); else ``None``, equality."""
    if agree is not None or not has_free_text(schema):
        return agree
    return partial(answers_agree, exact=labels(schema))

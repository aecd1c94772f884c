"""Stable item keys: the same call, in any process, gets the same key.

A key is the sha256 of a canonical JSON encoding (sorted keys, no whitespace, UTF-8
text kept as is) of everything that determines an item's answer: the function, the
model, the instructions, the output schema and the item itself. A process that starts
again with the same calls finds its items, jobs and results in the store by these keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from coalesce._exceptions import InvalidInputError

__all__ = ["KEY_VERSION", "canonical_json", "item_key"]

KEY_VERSION = "coalesce.item/1"
"""Part of every key, so that a future change of the encoding cannot collide with it."""


def canonical_json(value: Any) -> str:
    """Encode ``value`` as canonical JSON: sorted keys, no whitespace, non-ASCII kept.

    Raises:
        TypeError: ``value`` holds something JSON cannot encode (bytes, an object).
        ValueError: ``value`` holds NaN or an infinity, or a key type that cannot be sorted.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def item_key(
    function: str, model: str, instructions: str, output_schema: Mapping[str, Any], item: Any
) -> str:
    """The stable key (64 hex digits) of one call of ``function`` on ``item``.

    Tuples encode as lists; ``1`` and ``1.0`` encode differently, so their keys differ.

    Raises:
        InvalidInputError: the item or the schema is not JSON (NaN, bytes, an object,
            a lone surrogate).
    """
    parts = [KEY_VERSION, function, model, instructions, dict(output_schema), item]
    try:
        text = canonical_json(parts).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"cannot key the call of {function!r}: its item or output schema is not JSON"
            f" ({exc}); pass only JSON values (str, int, float, bool, None, list, dict)",
            field="$",
        ) from exc
    return hashlib.sha256(text).hexdigest()

"""What one function's requests cost in tokens besides the items: estimates, pure.

A packed request pays its shared part once (the instructions, the reply-format
sentence and, with structured output, the reply schema the provider bills as input);
each item adds its own input and output plus a small frame (its wrapper and schema
entry in the prompt, its key in the reply). A plain call of one item pays the
instructions (and output schema) and nothing else. Statistics compare with plain
calls through these numbers; the planner sizes groups with them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._wire.packing import pack_request
from .tokens import TokenEstimator

__all__ = ["Footprint", "footprint"]


@dataclass(frozen=True)
class Footprint:
    """Token estimates of one function's requests (see the module doc).

    Attributes:
        shared: Input tokens every packed request pays whatever its items.
        plain_shared: Input tokens a plain call of one item pays besides the item.
        item_frame: Input tokens each packed item adds besides its own input.
        answer_frame: Output tokens each packed answer adds besides its output.
    """

    shared: int
    plain_shared: int
    item_frame: int
    answer_frame: int


def footprint(
    instructions: str,
    output_schema: Mapping[str, Any],
    estimator: TokenEstimator,
    *,
    structured: bool,
    keyed: bool,
    pin: bool = True,
) -> Footprint:
    """Estimate the :class:`Footprint` of requests asking ``instructions`` for outputs of
    ``output_schema`` (``structured``: the provider is sent the reply schema; ``keyed``:
    wire format 2; ``pin``: the reply schema names every id)."""

    def size(n: int, *, system: bool) -> int:
        packed = pack_request(
            instructions, [None] * n, output_schema, structured=structured, pin=pin, keyed=keyed
        )
        tokens = estimator.count(packed.system if system else packed.user)
        if structured:
            tokens += estimator.count(json.dumps(packed.reply_schema, separators=(",", ":")))
        return tokens

    plain = estimator.count(instructions)
    if structured:
        plain += estimator.count(json.dumps(dict(output_schema), separators=(",", ":")))
    item = size(2, system=False) - size(1, system=False) - estimator.count("null")
    answer = estimator.count('"1":,' if keyed else '{"id":"1","output":},')
    return Footprint(size(1, system=True), plain, max(0, item), answer)

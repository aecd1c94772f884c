"""The answer's size, before any reply, of a call whose format is asked in its prompt.

A JSON-mode call (``response_format={"type": "json_object"}``) or a text call whose
framework asks for JSON in the prompt (instructor's ``JSON`` and ``MD_JSON`` modes,
pydantic-ai's ``PromptedOutput``, LangChain's ``json_mode``) carries no reply schema,
so its answer's size is a guess until a reply is measured. Most spell the schema out in
their instructions; when that schema bounds the answer (a classification's enums), its
longest instance is a better first estimate than the default guess. It sizes the first
groups only: nothing here is sent, enforced or used to check an answer, and the replies
replace it as they come.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._planning.longest import bounded_output_tokens
from .._planning.tokens import TokenEstimator

__all__ = ["spelled_output_tokens", "spelled_schema"]

#: Tokens around a JSON answer that a prompt may ask for (a Markdown code fence).
_FENCE_TOKENS = 8
#: Longest instructions searched, in characters (a spelled schema sits in the first ones
#: a framework writes; a long document pasted as instructions is not scanned whole).
_SEARCHED = 50_000


def spelled_schema(text: str) -> Mapping[str, Any] | None:
    """The first JSON schema of an object spelled out in ``text`` (an object with
    ``properties``), if any.

    Args:
        text: The instructions.
    """
    decoder = json.JSONDecoder()
    text = text[:_SEARCHED]
    start = text.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict) and isinstance(value.get("properties"), dict):
            return value
        start = text.find("{", end)
    return None


def spelled_output_tokens(
    instructions: str, estimator: TokenEstimator, *, fenced: bool = False
) -> int | None:
    """Expected tokens of one answer to ``instructions`` that spell out a bounded
    schema, else ``None``.

    Args:
        instructions: The call's shared instructions.
        estimator: Counts tokens for the call's model.
        fenced: The answer is text, which may wrap the JSON in a code fence.
    """
    schema = spelled_schema(instructions)
    if schema is None:
        return None
    tokens = bounded_output_tokens(schema, estimator)
    if tokens is None:
        return None
    return tokens + (_FENCE_TOKENS if fenced else 0)

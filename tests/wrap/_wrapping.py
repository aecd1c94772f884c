"""What the drop-in client's tests share: the calls they make and how they make many at
once."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anthropic
import anyio
import openai

T = TypeVar("T")

TEXT = {"type": "string"}
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["spam", "ham"]},
        "score": {"type": "integer"},
    },
    "required": ["label", "score"],
    "additionalProperties": False,
}
SYSTEM = {"role": "system", "content": "Answer briefly."}


def chat(text: Any, *, system: dict[str, Any] = SYSTEM, **extra: Any) -> dict[str, Any]:
    """The keyword arguments of a chat completion asking ``text`` after ``system``."""
    return {
        "model": "gpt-4o-mini",
        "messages": [system, {"role": "user", "content": text}],
        **extra,
    }


def msg(text: Any, **extra: Any) -> dict[str, Any]:
    """The keyword arguments of an Anthropic message asking ``text``."""
    return {
        "model": "claude-3-5-haiku",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


async def gather(n: int, call: Callable[[int], Awaitable[T]]) -> list[T]:
    """``call(0)`` ... ``call(n - 1)`` all at once; their results in order."""
    out: dict[int, T] = {}

    async def one(i: int) -> None:
        out[i] = await call(i)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return [out[i] for i in range(n)]


async def outcomes(n: int, call: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """Like :func:`gather`, with each call's SDK error (``openai.APIError``,
    ``anthropic.APIError``) in place of its result; any other exception is raised."""
    out: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    async def one(i: int) -> None:
        try:
            out[i] = await call(i)
        except Exception as exc:
            errors[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    for error in errors:
        if error is not None and not isinstance(error, (openai.APIError, anthropic.APIError)):
            raise error
    return [e if e is not None else o for o, e in zip(out, errors, strict=True)]


def accumulated(accumulate_event: Callable[..., Any], **arguments: Any) -> Any:
    """A call of an anthropic SDK ``accumulate_event``, giving ``json_bufs`` only where it
    takes it (from anthropic 1.5; before, it re-parses the partial JSON itself)."""
    if "json_bufs" not in inspect.signature(accumulate_event).parameters:
        arguments.pop("json_bufs", None)
    return accumulate_event(**arguments)

"""What the tests of synchronous callers share: a tagging function, the expected
answers, and calls from many threads at once (the fixtures are in ``conftest.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, TypeAdapter

import coalesce
from coalesce.testing import SimulatedProvider

T = TypeVar("T")

#: Concurrent calls per test, and the most requests they may take.
CALLS = 40
MOST_REQUESTS = 10
#: Items per request: 40 calls fill exactly 4 groups.
GROUP = 10


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]


def tickets(count: int = CALLS, prefix: str = "ticket") -> list[str]:
    return [f"{prefix} {index}: the invoice is wrong" for index in range(count)]


def expected(sim: SimulatedProvider, ticket: str) -> Tag:
    adapter: TypeAdapter[Tag] = TypeAdapter(Tag)
    return adapter.validate_python(sim.expected_output(ticket, adapter.json_schema()))


def make_tag(client: Any, **options: Any) -> coalesce.PromptFunction[[str], Tag]:
    """A tagging function whose groups go when full (``max_wait`` is long)."""
    options = {"max_items": GROUP, "max_wait": 5.0, "packing": "always", **options}

    @coalesce.prompt(client=client, model="gpt-4o-mini", **options)
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket with its category and urgency."""

    return tag


def in_threads(fn: Callable[[str], T], items: list[str]) -> list[T]:
    """``fn(item)`` for every item, each in a thread of its own, all let go at once."""
    start = threading.Barrier(len(items))

    def one(item: str) -> T:
        start.wait()
        return fn(item)

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(one, items))

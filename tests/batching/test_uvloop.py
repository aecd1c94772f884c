"""Under uvloop (uvicorn's loop when ``uvicorn[standard]`` is installed, so FastAPI's in
most deployments): a loop that is not asyncio's own takes the batcher's full path. It
used to recurse without end on the first call."""

from __future__ import annotations

import asyncio
import json

import pytest

import coalesce
from coalesce.providers import CallableProvider, CompletionRequest

uvloop = pytest.importorskip("uvloop", reason="uvloop is part of the dev extra (not on Windows)")


def test_a_batch_function_coalesces_under_uvloop() -> None:
    batches: list[list[int]] = []

    @coalesce.batch(max_items=3, max_wait=60.0)  # full at 3: dispatched without waiting
    async def double(items: list[int]) -> list[int]:
        batches.append(items)
        return [item * 2 for item in items]

    async def main() -> list[int]:
        assert not isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)
        return await asyncio.gather(*(double(n) for n in range(6)))

    assert uvloop.run(main()) == [0, 2, 4, 6, 8, 10]
    assert sorted(map(sorted, batches)) == [[0, 1, 2], [3, 4, 5]]


def test_a_prompt_function_is_answered_under_uvloop() -> None:
    async def answer(request: CompletionRequest) -> str:
        items = json.loads(request.user)
        return json.dumps({"results": {item["id"]: item["input"].upper() for item in items}})

    @coalesce.prompt(
        client=CallableProvider(answer), model="m", max_items=4, max_wait=60.0, packing="always"
    )
    async def shout(text: str) -> str:
        """Shout the text."""

    async def main() -> list[str]:
        try:
            return await asyncio.gather(*(shout(word) for word in ["a", "b", "c", "d"]))
        finally:
            await shout.aclose()

    assert uvloop.run(main()) == ["A", "B", "C", "D"]
    assert shout.statistics().requests == 1

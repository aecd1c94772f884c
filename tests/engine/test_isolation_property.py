"""Property: whatever the items and whatever the model writes, each caller gets its own
right output or an error of its own: never another caller's output, and never a hang.

The items mix good ones with bad ones (NaN, a lone surrogate, too many tokens for the
model's window). The fake model answers each request as a generated behaviour says:
the right JSON, an id twice (another caller's output first, or last), an id missing, an
id not asked for, the answers shuffled, prose, a code fence, a cut-off or malformed
reply, or a failed request; re-asks draw the next behaviour, so one run mixes them.
It does not enforce the reply schema (nothing constrains its output), so coalesce must
check everything it is given. Runs on asyncio and trio, on virtual time.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import looptime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from trio.testing import MockClock

import coalesce
from coalesce import InvalidInputError
from coalesce.providers import CallableProvider, Completion, CompletionRequest

MODEL = "smollm2"  # an 8,192-token window
TOO_LARGE = "word " * 9_000


class Answer(BaseModel):
    of: int
    text: str


def right(item: dict[str, Any]) -> dict[str, Any]:
    """The one right output for ``item``."""
    return {"of": item["id"], "text": item["text"]}


# -- what the callers send ------------------------------------------------------------------

BAD = {
    "nan": math.nan,
    "surrogate": "half a pair: \ud83d",
    "too large": TOO_LARGE,
}

texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
kinds = st.sampled_from(["good"] * 6 + list(BAD))
items_strategy = st.lists(st.tuples(kinds, texts), min_size=2, max_size=8).map(
    lambda drawn: [
        {"id": i, "text": text if kind == "good" else BAD[kind]}
        for i, (kind, text) in enumerate(drawn)
    ]
)


def is_bad(item: dict[str, Any]) -> bool:
    text = item["text"]
    return not isinstance(text, str) or text == TOO_LARGE or "\ud83d" in text


# -- what the model writes ---------------------------------------------------------------------


@dataclass(frozen=True)
class Behaviour:
    kind: str
    pick: int  # which answer it damages
    seed: int  # for shuffles and cuts


KINDS = [
    "right",
    "wrong twin first",
    "wrong twin last",
    "missing",
    "extra",
    "shuffled",
    "prose",
    "fenced",
    "truncated",
    "malformed",
    "fails",
]
behaviours = st.lists(
    st.builds(Behaviour, st.sampled_from(KINDS), st.integers(0, 20), st.integers(0, 2**16)),
    min_size=1,
    max_size=8,
)


def encode_results(entries: Sequence[tuple[str, Any]], broken: int | None = None) -> str:
    """``{"results": {...}}`` written by hand, so that an id may appear twice; the
    ``broken`` entry lacks its colon (malformed JSON from there on)."""
    body = ",".join(
        json.dumps(key) + ("" if index == broken else ":") + json.dumps(value)
        for index, (key, value) in enumerate(entries)
    )
    return '{"results":{' + body + "}}"


def packed_reply(asked: list[dict[str, Any]], how: Behaviour) -> str:
    entries = [(entry["id"], right(entry["input"])) for entry in asked]
    k = how.pick % len(entries)
    other = right(asked[(k + 1) % len(asked)]["input"])  # another caller's output
    other = other if len(asked) > 1 else {"of": -1, "text": "nobody's"}
    if how.kind == "wrong twin first":
        entries.insert(k, (entries[k][0], other))
    elif how.kind == "wrong twin last":
        entries.insert(k + 1, (entries[k][0], other))
    elif how.kind == "missing":
        del entries[k]
    elif how.kind == "extra":
        entries.insert(k, (str(len(asked) + 1 + how.pick), other))
    elif how.kind == "shuffled":
        random.Random(how.seed).shuffle(entries)
    return encode_results(entries, k if how.kind == "malformed" else None)


def damage(text: str, how: Behaviour) -> str:
    """The reply text as a whole-text behaviour damages it.

    Every damage leaves the reply detectably wrong: a model that writes a well-formed
    but wrong output for an id is beyond any check, so it is not generated.
    """
    if how.kind == "prose":
        return "Sorry, I cannot answer these."
    if how.kind == "fenced":
        return f"```json\n{text}\n```"
    if how.kind == "truncated":
        return text[: random.Random(how.seed).randrange(len(text))]
    if how.kind == "malformed" and not text.startswith('{"results"'):
        return text[:-1]  # a plain reply without its closing brace
    return text


class Model:
    """A fake model that writes the next behaviour's reply, then right ones."""

    def __init__(self, plan: list[Behaviour]) -> None:
        self.plan = list(plan)
        self.requests = 0

    async def __call__(self, request: CompletionRequest) -> Completion:
        self.requests += 1
        how = self.plan.pop(0) if self.plan else Behaviour("right", 0, 0)
        await anyio.sleep(0.1)
        if how.kind == "fails":
            raise RuntimeError("the provider failed this request")
        if request.user.startswith('[{"id":'):
            text = packed_reply(json.loads(request.user), how)
        else:  # a plain call of one item: the output itself
            text = json.dumps(right(json.loads(request.user)))
        cut = how.kind == "truncated"
        return Completion(damage(text, how), "length" if cut else "stop")


# -- the property ----------------------------------------------------------------------------


def run_on(backend: str, fn: Any) -> Any:
    if backend == "trio":
        clock = MockClock(autojump_threshold=0)
        return anyio.run(fn, backend="trio", backend_options={"clock": clock})
    return anyio.run(
        fn, backend="asyncio", backend_options={"loop_factory": looptime.new_event_loop}
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("stream", [True, False])
@settings(max_examples=60)
@given(items=items_strategy, plan=behaviours, max_items=st.sampled_from([1, 3, 8, 8]))
def test_each_caller_gets_its_own_output_or_its_own_error(
    backend: str, stream: bool, items: list[dict[str, Any]], plan: list[Behaviour], max_items: int
) -> None:
    model = Model(plan)
    outcomes: dict[int, Any] = {}

    @coalesce.prompt(
        packing="always",
        client=CallableProvider(model),
        model=MODEL,
        max_items=max_items,
        max_wait=0.05,
        stream=stream,
    )
    async def answer(ticket: dict[str, Any]) -> Answer:
        """Echo the ticket's id as "of" and its text as "text"."""

    async def caller(item: dict[str, Any]) -> None:
        try:
            outcomes[item["id"]] = await answer(item)
        except Exception as exc:
            outcomes[item["id"]] = exc

    async def main() -> None:
        with anyio.fail_after(3600):  # virtual time: a hang fails here, at once
            async with anyio.create_task_group() as tg:
                for item in items:
                    tg.start_soon(caller, item)
            await answer.aclose()

    run_on(backend, main)

    assert sorted(outcomes) == [item["id"] for item in items]  # everyone was answered
    for item in items:
        got = outcomes[item["id"]]
        if is_bad(item):
            assert isinstance(got, InvalidInputError), got
        elif not isinstance(got, Exception):
            assert got == Answer(**right(item)), f"caller {item['id']} got {got!r}"
    if all(is_bad(item) for item in items):
        assert model.requests == 0  # refused callers never reach the model

"""An item's last attempt goes alone, as a plain call, through the drop-in client
(issue 24, item 3): a packed reply that drops, duplicates or shuffles items cannot
defeat it. On virtual time, both SDKs, both backends."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from _wrapping import SCHEMA, TEXT, chat, msg, outcomes

import coalesce
from coalesce._wrap import wrap
from coalesce.testing import FaultPlan, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

#: What a provider that ignores the reply schema does to packed replies (the item
#: faults of benchmarks/bench_trust.py, the run of issue 24): ids duplicated (the
#: wrong answer first, or second), missing, extra and shuffled. A plain call of one
#: item cannot suffer them.
FAULTS = {
    "duplicate_id_wrong_first": 0.1,
    "duplicate_id": 0.1,
    "missing_item": 0.1,
    "extra_id": 0.1,
    "out_of_order": 0.1,
}
#: Every packed reply loses an item.
LOSSY = {"missing_item": 0.5, "duplicate_id_wrong_first": 0.5}
TOOL = [{"name": "verdict", "input_schema": SCHEMA}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}


def _client(sim: SimulatedProvider, sdk: str, events: list[Any], **options: Any) -> Any:
    raw = sim.openai_client(max_retries=0) if sdk == "openai" else sim.anthropic_client()
    return wrap(raw, packing="always", on_event=events.append, **options)


async def _ask(client: Any, sdk: str, n: int, prefix: str) -> list[Any]:
    if sdk == "openai":
        replies = await outcomes(
            n, lambda i: client.chat.completions.create(**chat(f"{prefix}{i}"))
        )
        return [r if isinstance(r, Exception) else r.choices[0].message.content for r in replies]
    replies = await outcomes(n, lambda i: client.messages.create(**msg(f"{prefix}{i}")))
    return [r if isinstance(r, Exception) else r.content[0].text for r in replies]


def _last(events: list[Any], max_attempts: int) -> list[coalesce.RequestEvent]:
    return [e for e in events if isinstance(e, coalesce.RequestEvent) and e.attempt == max_attempts]


async def _streamed(client: Any, sdk: str, item: str) -> Any:
    """One streamed call's answer: a JSON-schema reply (openai), a forced tool's
    input (anthropic)."""
    if sdk == "openai":
        kwargs = chat(item, response_format=FORMAT, stream=True)
        chunks = await client.chat.completions.create(**kwargs)
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    else:
        tool = {"tools": TOOL, "tool_choice": {"type": "tool", "name": "verdict"}}
        events = await client.messages.create(**msg(item, stream=True, **tool))
        text = "".join(
            [
                e.delta.partial_json
                async for e in events
                if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
            ]
        )
    return json.loads(text)


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_400_of_400_answered_under_reply_faults(sdk: str) -> None:
    # 400 calls at 100/s, groups of up to 8, half of the packed replies damaged.
    sim = SimulatedProvider(faults=FaultPlan(probabilities=FAULTS, seed=3))
    events: list[Any] = []
    raw = sim.openai_client() if sdk == "openai" else sim.anthropic_client()
    client = wrap(raw, max_items=8, packing="always", on_event=events.append)
    items = [f"mail {i}: win a prize now" for i in range(400)]

    async def one(i: int) -> Any:
        await anyio.sleep(i / 100)
        return await _streamed(client, sdk, items[i])

    answers = await outcomes(400, one)
    await client.aclose()
    assert answers == [expected_output(item, SCHEMA) for item in items]
    assert sim.statistics().faults > 25
    assert any(e.reask for e in events if isinstance(e, coalesce.RequestEvent))
    assert all(e.items == 1 and e.plain for e in _last(events, 4))


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_the_last_attempt_carries_one_item_unpacked(sdk: str) -> None:
    # The first reply of 8 is cut half way: its lost items' second attempt is their
    # last (max_attempts=2), so each goes alone, as a plain call, all at once. Packed
    # again, every reply would lose one of them.
    sim = SimulatedProvider(faults=FaultPlan(script=["truncate"], probabilities=LOSSY))
    events: list[Any] = []
    client = _client(sim, sdk, events, max_items=8, max_attempts=2, max_wait=1.0)
    answers = await _ask(client, sdk, 8, "t")
    await client.aclose()
    assert answers == [sim.expected_output(f"t{i}", TEXT) for i in range(8)]
    last = _last(events, 2)
    assert len(last) >= 3
    assert [(e.items, e.plain) for e in last] == [(1, True)] * len(last)
    assert [r.items for r in sim.requests] == [8] + [1] * len(last)
    starts = {r.started_at for r in sim.requests[1:]}
    assert len(starts) == 1  # sent at once, not one after another

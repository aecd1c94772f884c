"""``shadow=`` on ``@coalesce.prompt`` and ``coalesce.wrap`` (issue 15, point 3): a sample of
packed items is asked again alone, agreement is tracked per group size, and the group
cap comes down where packing changes the answers. On the simulated provider, on
virtual time."""

from __future__ import annotations

from typing import Any, Literal

import anyio
import pytest

import coalesce
from coalesce.testing import PackingDegradation, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

Label = Literal["positive", "negative", "neutral"]
RULES = " ".join(f"Rule {n}: judge the whole review, not one word." for n in range(30))


def classifier(client: Any, **options: Any) -> Any:
    async def classify(review: str) -> Label:
        """Classify the review's sentiment."""

    options.setdefault("max_items", 8)
    options.setdefault("max_wait", 1.0)
    return coalesce.prompt(
        client=client, model="gpt-4o-mini", instructions=f"Classify. {RULES}", **options
    )(classify)


async def ask_all(fn: Any, reviews: list[str]) -> dict[str, Any]:
    answers: dict[str, Any] = {}

    async def one(review: str) -> None:
        answers[review] = await fn(review)

    async with anyio.create_task_group() as tg:
        for review in reviews:
            tg.start_soon(one, review)
    return answers


def right(review: str) -> Any:
    schema = {"enum": ["positive", "negative", "neutral"], "type": "string"}
    return expected_output(review, schema)


async def test_agreeing_answers_keep_the_cap_and_the_shadow_cost_is_counted() -> None:
    sim = SimulatedProvider()
    events: list[Any] = []
    fn = classifier(sim.openai_client(), shadow=0.25, on_event=events.append)
    reviews = [f"review {i}" for i in range(64)]
    answers = await ask_all(fn, reviews)
    await fn.aclose()
    assert answers == {review: right(review) for review in reviews}
    stats = fn.statistics()
    assert stats.items_per_request == 8  # the callers' requests (shadow calls apart)
    assert stats.shadow_requests == 16  # exactly a quarter of the packed items
    assert [r.items for r in sim.requests].count(1) == 16
    assert dict(stats.agreement_by_size) == {8: coalesce.Agreement(16, 16, *_interval(16))}
    assert stats.group_cap == 8
    assert 0 < stats.shadow_cost < stats.estimated_cost
    shadows = [e for e in events if isinstance(e, coalesce.ShadowEvent)]
    assert len(shadows) == 16
    assert all(e.agreed and e.size == 8 and e.cap == 8 for e in shadows)


def _interval(n: int) -> tuple[float, float]:
    from coalesce._accuracy.shadow import wilson_interval

    return wilson_interval(n, n)


async def test_without_shadow_nothing_is_asked_twice() -> None:
    sim = SimulatedProvider()
    fn = classifier(sim.openai_client())
    await ask_all(fn, [f"review {i}" for i in range(16)])
    await fn.aclose()
    stats = fn.statistics()
    assert stats.shadow_requests == 0
    assert dict(stats.agreement_by_size) == {}
    assert stats.group_cap == 8
    assert len(sim.requests) == 2


async def ask_in_bursts(fn: Any, reviews: list[str], burst: int) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    for start in range(0, len(reviews), burst):
        answers |= await ask_all(fn, reviews[start : start + burst])
    return answers


async def test_the_guard_brings_the_cap_down_where_packing_changes_the_answers() -> None:
    # Groups of up to 4 answer as plain calls do; every item past the 4th adds 5% of
    # wrong answers (60% at 16, 20% at 8).
    sim = SimulatedProvider(degradation=PackingDegradation(per_extra_item=0.05, free_items=4))
    events: list[Any] = []
    fn = classifier(sim.openai_client(), max_items=16, shadow=0.5, on_event=events.append)
    reviews = [f"review {i}" for i in range(800)]
    answers = await ask_in_bursts(fn, reviews, burst=16)
    await fn.aclose()
    stats = fn.statistics()
    packed = sum(r.items for r in sim.requests if r.items > 1)
    assert stats.shadow_requests == packed // 2  # half the packed items...
    assert stats.shadow_requests <= 400  # ...a few hundred at most, and by then...
    assert stats.group_cap is not None
    assert stats.group_cap <= 8  # ...the cap came down from 16
    caps = [e.cap for e in events if isinstance(e, coalesce.ShadowEvent)]
    lowered = next(i for i, cap in enumerate(caps) if cap < 16)
    assert lowered < 60  # came down after a few dozen verdicts at 16 (to just before
    # the first position confidently weak, then on to 8 or less, as asserted above)
    agreement = stats.agreement_by_size
    assert agreement[16].high < 0.9
    assert agreement[16].total <= 60  # 16 was judged within its first verdicts
    # Later groups were smaller: most items were asked at or under the lower cap.
    sizes = [r.items for r in sim.requests if r.items > 1]
    assert sizes[-1] <= 8
    assert sum(1 for s in sizes if s <= 8) > sum(1 for s in sizes if s > 8)
    # The callers kept their packed answers (the shadow answer is never delivered).
    wrong = [r for r in reviews if answers[r] != right(r)]
    assert len(wrong) == sum(r.degraded for r in sim.requests)
    # Each fall of the cap is an alarm, at WARNING, naming the function and the caps.
    alarms = [e for e in events if isinstance(e, coalesce.DisagreementAlarm)]
    assert alarms
    assert alarms[0].old_cap == 16
    assert alarms[0].cap < 16
    assert [(a.old_cap, a.cap) for a in alarms] == [
        (old, new) for old, new, _ in stats.cap_learning.moves if new < old
    ]
    assert "classify" in alarms[0].function
    assert "group cap 16 -> " in str(alarms[0])


async def test_the_alarm_is_logged_at_warning_without_a_hook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = SimulatedProvider(degradation=PackingDegradation(per_extra_item=0.05, free_items=4))
    fn = classifier(sim.openai_client(), max_items=16, shadow=0.5)
    with caplog.at_level("WARNING", logger="coalesce"):
        await ask_in_bursts(fn, [f"review {i}" for i in range(320)], burst=16)
    await fn.aclose()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert any("packed answers disagreed" in r.getMessage() for r in warnings)
    assert all("DIFFERED" not in r.getMessage() for r in warnings)  # verdicts stay at INFO


async def test_without_degradation_the_cap_stays_at_max_items() -> None:
    sim = SimulatedProvider()
    fn = classifier(sim.openai_client(), max_items=16, shadow=0.5)
    await ask_in_bursts(fn, [f"review {i}" for i in range(320)], burst=16)
    await fn.aclose()
    stats = fn.statistics()
    assert stats.group_cap == 16
    assert stats.agreement_by_size[16].agreed == stats.agreement_by_size[16].total == 160


async def test_wrap_shadows_packed_calls_too() -> None:
    sim = SimulatedProvider(degradation=PackingDegradation(per_extra_item=0.1, free_items=1))
    client = coalesce.wrap(
        sim.openai_client(), max_items=8, max_wait=1.0, packing="always", shadow=1.0
    )
    system = f"Summarise the ticket in a few words. {RULES}"

    async def one(n: int) -> str:
        reply = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": f"ticket {n}"},
            ],
        )
        return reply.choices[0].message.content or ""

    for start in range(0, 96, 8):
        async with anyio.create_task_group() as tg:
            for n in range(start, start + 8):
                tg.start_soon(one, n)
    await client.aclose()  # type: ignore[attr-defined]
    (stats,) = client.statistics().values()  # type: ignore[attr-defined]
    assert stats.shadow_requests > 0
    assert sum(a.total for a in stats.agreement_by_size.values()) == stats.shadow_requests
    assert stats.group_cap is not None
    assert stats.group_cap < 8  # 70% wrong at 8: the cap came down


async def test_wrap_reports_every_kind_of_call_of_a_model() -> None:
    # Two system prompts are two kinds of call, each with its own engine and guard, and
    # one recorder for the model: its statistics add both guards' verdicts up.
    sim = SimulatedProvider(degradation=PackingDegradation(per_extra_item=0.1, free_items=1))
    client = coalesce.wrap(
        sim.openai_client(), max_items=8, max_wait=1.0, packing="always", shadow=1.0
    )

    async def one(kind: str, n: int) -> None:
        await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": f"{kind} the ticket in a few words. {RULES}"},
                {"role": "user", "content": f"ticket {n}"},
            ],
        )

    for kind in ("Summarise", "Title"):
        for start in range(0, 48, 8):
            async with anyio.create_task_group() as tg:
                for n in range(start, start + 8):
                    tg.start_soon(one, kind, n)
    await client.aclose()  # type: ignore[attr-defined]
    (stats,) = client.statistics().values()  # type: ignore[attr-defined]
    engines = [router.engine for router in client._engines._routers.values()]  # type: ignore[attr-defined]
    guards = [engine.shadow for engine in engines]
    assert len(guards) == 2
    assert all(guard.agreement() for guard in guards)  # both kinds were shadowed
    assert sum(a.total for a in stats.agreement_by_size.values()) == stats.shadow_requests
    assert stats.group_cap == min(guard.cap for guard in guards)

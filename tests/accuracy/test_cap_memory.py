"""The learned group cap (issue 24, item 1): kept between processes, learned per model
and function, pinned by an explicit ``max_items``, off with ``shadow=0``. The memory
on its own, then ``@coalesce.prompt`` on the simulated provider, on virtual time."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

import anyio
import platformdirs
import pytest

import coalesce
from coalesce._accuracy.memory import CapMemory, Evidence, memory_dir
from coalesce._accuracy.shadow import ShadowGuard
from coalesce._engine.spec import Options
from coalesce._options import LEARNED_CAP_CEILING, PROMPT_MAX_ITEMS
from coalesce.testing import SimulatedProvider

RULES = " ".join(f"Rule {n}: judge the whole review, not one word." for n in range(30))


def test_the_default_max_items_is_told_apart_from_a_given_one() -> None:
    assert type(PROMPT_MAX_ITEMS) is int
    assert Options().max_items is coalesce.NOT_GIVEN
    assert Options().most_items == Options(max_items=4).most_items == PROMPT_MAX_ITEMS
    assert Options(max_items=4).max_items == 4


def test_the_memory_lives_beside_the_job_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert memory_dir({"COALESCE_STORE": str(tmp_path / "jobs.sqlite3")}) == tmp_path / "caps"
    assert memory_dir({"COALESCE_STORE": "~/x/jobs.db"}) == Path.home() / "x" / "caps"
    user_data = Path(platformdirs.user_data_dir("coalesce", appauthor=False))
    assert memory_dir({"COALESCE_STORE": ""}) == user_data / "caps"
    monkeypatch.delenv("COALESCE_STORE")
    assert memory_dir() == user_data / "caps"


def test_evidence_round_trips(tmp_path: Path) -> None:
    memory = CapMemory(tmp_path / "caps" / "k.json", "gpt-4o-mini")
    assert memory.load() is None
    evidence = Evidence(
        cap=16,
        bad=32,
        counts={8: (35, 35), 16: (40, 41)},
        recent={16: [True, False, True]},
        tail=[True, True],
        positions={9: (1, 1), 12: (1, 1)},
        learning_requests=120,
        moves=[(4, 8, "agreed"), (8, 16, "agreed")],
    )
    memory.save(evidence)
    assert memory.load() == evidence
    data = json.loads(memory.path.read_text())
    assert data["version"] == 1
    assert data["model"] == "gpt-4o-mini"
    assert [p.name for p in memory.path.parent.iterdir()] == ["k.json"]  # no temporary left


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"version": 99, "cap": 8}',
        '{"version": 1, "cap": 0, "counts": {}, "recent": {}, "tail": [], "positions": {}}',
        '{"version": 1, "cap": 8, "counts": {"8": [5, 3]}, "recent": {}, "tail": [],'
        ' "positions": {}}',
        '{"version": 1, "cap": 8, "counts": {}, "recent": {}, "tail": [1], "positions": {}}',
        '{"version": 1, "cap": "8x"}',
    ],
)
def test_a_corrupt_file_is_logged_and_learning_starts_afresh(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    memory = CapMemory(tmp_path / "k.json")
    memory.path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="coalesce"):
        assert memory.load() is None
        guard = ShadowGuard(0.01, 0.9, 32, learn=True, start=4, memory=memory)
    assert guard.cap == 4
    assert "learning the cap afresh" in caplog.text


def test_a_file_that_cannot_be_written_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    memory = CapMemory(blocker / "caps" / "k.json")  # a directory under a file
    with caplog.at_level(logging.WARNING, logger="coalesce"):
        memory.save(Evidence(cap=8))
    assert "cannot save the learned cap" in caplog.text


def test_a_guard_starts_where_its_memory_stopped_within_its_limit(tmp_path: Path) -> None:
    memory = CapMemory(tmp_path / "k.json")
    learned = ShadowGuard(1.0, 0.9, 32, learn=True, start=4, memory=memory)
    for n in range(200):
        size = learned.cap
        learned.record(size, "a", "a", size // 2 + 1 + n % (size - size // 2))
    assert learned.cap == 32
    learned.save()
    again = ShadowGuard(1.0, 0.9, 32, learn=True, start=4, memory=memory)
    assert again.cap == 32
    assert again.agreement() == learned.agreement()
    assert again.learning().moves == learned.learning().moves
    assert ShadowGuard(1.0, 0.9, 16, learn=True, start=4, memory=memory).cap == 16


# -- through @coalesce.prompt ---------------------------------------------------------

Label = Literal["positive", "negative", "neutral"]


def prompted(sim: SimulatedProvider, fn: Any, task: str, **options: Any) -> Any:
    """``fn`` as a ``@coalesce.prompt`` function of its own instructions on ``sim``."""
    return coalesce.prompt(
        client=sim.openai_client(),
        model="gpt-4o-mini",
        instructions=f"{task} {RULES}",
        max_wait=0.5,
        **options,
    )(fn)


def classifier(sim: SimulatedProvider, **options: Any) -> Any:
    async def classify(review: str) -> Label:
        """Classify the review's sentiment."""

    return prompted(sim, classify, "Classify.", **options)


async def ask_in_bursts(fn: Any, n: int, burst: int = 32) -> None:
    async def one(i: int) -> None:
        await fn(f"review {i}")

    for start in range(0, n, burst):
        async with anyio.create_task_group() as tg:
            for i in range(start, min(n, start + burst)):
                tg.start_soon(one, i)


@pytest.mark.anyio
async def test_the_default_learns_the_cap_and_a_restart_starts_there() -> None:
    sim = SimulatedProvider()
    fn = classifier(sim)
    assert fn.statistics().group_cap == 4
    await ask_in_bursts(fn, 1600)
    await fn.aclose()
    stats = fn.statistics()
    assert stats.group_cap == LEARNED_CAP_CEILING  # right at any size: up to the ceiling
    assert stats.shadow_requests < 0.15 * 1600
    assert max(r.items for r in sim.requests) == LEARNED_CAP_CEILING
    # Another process of the same app: the same function starts at the learned cap.
    restarted = classifier(SimulatedProvider())
    assert restarted.statistics().group_cap == LEARNED_CAP_CEILING
    # ... and another function (other instructions) starts afresh.
    other = coalesce.prompt(
        client=sim.openai_client(), model="gpt-4o-mini", instructions=f"Is it a film? {RULES}"
    )(_other)
    assert other.statistics().group_cap == 4


async def _other(review: str) -> Label:
    """Say whether the review is about a film."""


@pytest.mark.anyio
async def test_an_explicit_max_items_pins_the_cap_and_shadow_0_turns_learning_off() -> None:
    for options in ({"max_items": 4}, {"shadow": 0}):
        sim = SimulatedProvider()
        fn = classifier(sim, **options)
        await ask_in_bursts(fn, 400)
        await fn.aclose()
        assert fn.statistics().group_cap == 4
        assert max(r.items for r in sim.requests) == 4
    assert list(Path(os.environ["COALESCE_STORE"]).parent.glob("caps/*")) == []


def summarizer(sim: SimulatedProvider, **options: Any) -> Any:
    async def summarize(review: str) -> str:
        """Summarize the review in one sentence."""

    return prompted(sim, summarize, "Summarize.", **options)


@pytest.mark.anyio
async def test_free_text_learns_its_cap_at_default_options_and_agree_wins() -> None:
    # Free text is compared by its words (issue 37): it learns as a classification does.
    sim = SimulatedProvider()
    fn = summarizer(sim)
    await ask_in_bursts(fn, 800)
    await fn.aclose()
    stats = fn.statistics()
    assert stats.group_cap > 4
    assert 0 < stats.shadow_requests < 0.25 * 800  # learning's share, LEARN_SHARE
    # The user's own comparison wins: one that never agrees brings the cap down.
    sim = SimulatedProvider()
    fn = summarizer(sim, agree=lambda packed, plain: False)
    await ask_in_bursts(fn, 800)
    await fn.aclose()
    assert fn.statistics().group_cap < 4

"""Where the learned group cap is kept (issue 36, point 2): beside the job store of
``store=``, else of ``$COALESCE_STORE``; nowhere on disk with ``":memory:"``. Shown in
``statistics().cap_learning.stored`` and logged once at INFO; the tests and the
benchmarks never keep theirs in the user's directory."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import anyio
import platformdirs
import pytest
from test_cap_memory import ask_in_bursts, classifier

import coalesce
from coalesce._lanes.store import JobStore
from coalesce.testing import SimulatedProvider

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


async def _learned(**options: Any) -> coalesce.CapLearning:
    fn = classifier(SimulatedProvider(), **options)
    await ask_in_bursts(fn, 200)
    await fn.aclose()
    learning = fn.statistics().cap_learning
    assert learning is not None
    assert learning.learned
    return learning


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "group caps are kept in" in r.getMessage()]


@pytest.mark.anyio
async def test_store_names_where_the_caps_are_kept_and_the_log_says_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coalesce")
    learning = await _learned(store=tmp_path / "mine" / "jobs.sqlite3")
    assert learning.stored is not None
    stored = Path(learning.stored)
    assert stored.parent == tmp_path / "mine" / "caps"
    assert await anyio.Path(stored).exists()
    await _learned(store=JobStore(tmp_path / "mine" / "jobs.sqlite3"))  # the same place
    assert len(_said(caplog)) == 1
    assert str(stored.parent) in _said(caplog)[0]
    assert "':memory:'" in _said(caplog)[0]  # how to turn it off
    assert not Path(os.environ["COALESCE_STORE"]).parent.exists()  # not the default place


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["store=", "COALESCE_STORE"])
async def test_in_memory_writes_nothing(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coalesce")
    monkeypatch.chdir(tmp_path)
    if how == "COALESCE_STORE":
        monkeypatch.setenv("COALESCE_STORE", ":memory:")
    learning = await _learned(**({"store": ":memory:"} if how == "store=" else {}))
    assert learning.stored is None
    assert [path async for path in anyio.Path(tmp_path).rglob("*")] == []
    assert _said(caplog) == []


def test_the_test_suite_keeps_its_state_apart() -> None:
    user = Path(platformdirs.user_data_dir("coalesce", appauthor=False))
    assert not Path(os.environ["COALESCE_STORE"]).is_relative_to(user)  # tests/conftest.py


@pytest.mark.parametrize(
    "bench", sorted(p.name for p in BENCHMARKS.glob("bench_*.py")), ids=lambda name: name
)
def test_a_benchmark_that_asks_a_model_keeps_its_state_apart(bench: str) -> None:
    text = (BENCHMARKS / bench).read_text(encoding="utf-8")
    asks = re.search(r"coalesce\.(prompt|wrap)\(|run_workload|coalesce serve|_demo import", text)
    assert not asks or "COALESCE_STORE" in text

"""``coalesce demo``: the main job runs end to end and prints its table."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coalesce._demo import Result, best_plain, poisson, render, tickets


def test_workload_is_deterministic() -> None:
    assert tickets(5, seed=1) == tickets(5, seed=1)
    arrivals = poisson(1000, rate=100.0, seed=1)
    assert arrivals == sorted(arrivals)
    assert 8.0 < arrivals[-1] < 12.0  # 1000 arrivals at 100/s take about 10 s


def test_render_compares_every_mode_with_one_call_per_item() -> None:
    base = Result("one call per item", [0.5, 1.0, 3.0], 2.0, 3, 300, 30, 0.003, 1.0)
    grouped = Result("coalesced", [1.0, 1.5, 1.9], 2.0, 1, 120, 30, 0.001, 3.0)
    table = render([base, grouped])
    assert "| one call per item | 1.00 s |" in table
    assert "66.7%" in table  # within budget: 2 of 3 calls
    assert "| coalesced |" in table
    assert table.rstrip().endswith("67% |")  # a third of the cost: 67% saved


def test_saved_is_against_the_cheaper_plain_row() -> None:
    plain = Result("one call per item", [0.5], 2.0, 1, 300, 30, 0.004, 1.0)
    cached = Result("one call per item, prompt cache", [0.5], 2.0, 1, 300, 30, 0.002, 1.0)
    grouped = Result("coalesced", [1.0], 2.0, 1, 120, 30, 0.001, 3.0)
    assert best_plain([plain, cached, grouped]) is cached
    rows = render([plain, cached, grouped]).splitlines()
    assert rows[2].endswith("-100% |")  # the naive plain row costs twice the cached one
    assert rows[-1].endswith("50% |")  # half the cached plain row, not 75% of the naive


@pytest.mark.slow
def test_the_demo_runs_and_prints_its_table() -> None:
    command = [sys.executable, "-m", "coalesce", "demo", "--items", "60", "--rate", "200"]
    out = subprocess.run(
        [*command, "--plot", ""], capture_output=True, text=True, timeout=120, check=True
    )
    assert "| one call per item |" in out.stdout
    assert "| fixed groups of 20 |" in out.stdout
    assert "| coalesced, budget 2 s |" in out.stdout
    assert "cheaper than one call per item" in out.stdout

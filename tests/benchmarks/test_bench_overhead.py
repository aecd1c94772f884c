"""bench_overhead runs and prints its tables (``--smoke``: a few calls of each row).

Not timed: the figures of a smoke run mean nothing, and the test never reads them.
"""

from __future__ import annotations

import os

import bench_overhead
import pytest


def test_the_smoke_run_prints_every_table(capsys: pytest.CaptureFixture[str]) -> None:
    environ = dict(os.environ)
    bench_overhead.main(["--smoke"])
    printed = capsys.readouterr().out
    for title in (
        "## CPU per call (",
        "## CPU per call by stage",
        "## Per call, counted in the profiled run",
        "## The batching layer alone",
        "## The gateway's coalesced path",
        "## Targets",
    ):
        assert title in printed
    for stage in bench_overhead.STAGES[:3]:
        assert f"| {stage} |" in printed
    assert "wrong answers" not in printed
    assert "| 200 | 200 | none |" in printed  # every gateway call answered right
    assert dict(os.environ) == environ  # its store was its own, and is gone

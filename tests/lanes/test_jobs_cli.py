"""``coalesce jobs list | show | results``: reading the job store from the command line.

Stores are built with :class:`JobStore` in ``tmp_path`` on a ticking wall clock; the
commands run through ``coalesce.cli.main`` (and once as ``python -m coalesce``).
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import pytest

from coalesce._lanes.jobs_cli import JobsError, resolve_job, utc
from coalesce._lanes.records import BatchJob, ItemRow, PlannedLine
from coalesce._lanes.store import JobStore
from coalesce.cli import main

SCHEMA = {"type": "object", "properties": {"tag": {"type": "string"}}}
Run = Callable[..., tuple[int, str, str]]


def ticks() -> Callable[[], float]:
    """A wall clock starting at 2025-01-01T00:00:00Z, one second per reading."""
    counter = itertools.count(1_735_689_600)
    return lambda: float(next(counter))


def row(n: int) -> ItemRow:
    return ItemRow.for_call("tag", "m", "Tag the ticket.", SCHEMA, {"ticket": n})


def plan(store: JobStore, *groups: list[str], provider: str = "openai") -> BatchJob:
    lines = []
    for keys in groups:
        cid = store.new_custom_id()
        lines.append(PlannedLine(cid, {"custom_id": cid, "body": {"items": keys}}, keys))
    return store.plan_job(provider, "m", "batch", lines, metadata={"run": "nightly"})  # type: ignore[arg-type]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.sqlite3"


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def run(*argv: str | Path) -> tuple[int, str, str]:
        code = main(["jobs", *map(str, argv)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def two_jobs(path: Path) -> tuple[BatchJob, BatchJob, list[str]]:
    """An older job: 2 done, 1 failed, 1 released (expired); a newer one holding the
    released item and one more, submitted and unanswered."""
    with JobStore(path, clock=ticks()) as store:
        keys = store.add_items([row(n) for n in range(5)])
        old = plan(store, keys[0:2], keys[2:3], keys[3:4])
        store.mark_uploaded(old.id, "file-old")
        store.mark_submitted(old.id, "batch_old")
        lines = store.job_lines(old.id)
        store.record_line_results(
            [(lines[0].custom_id, {k: {"tag": k[:4]} for k in keys[0:2]}, {})]
        )
        store.record_line_results([(lines[1].custom_id, {}, {keys[2]: "invalid JSON"})])
        store.finish_job(old.id, "expired", cost_usd=0.0125)
        new = plan(store, [keys[3], keys[4]], provider="anthropic")
        store.mark_submitted(new.id, "msgbatch_new")
        return store.get_job(old.id) or old, store.get_job(new.id) or new, keys


# --- list ------------------------------------------------------------------------------


def test_list_shows_one_aligned_row_per_job_newest_first(path: Path, run: Run) -> None:
    old, new, _ = two_jobs(path)
    code, out, err = run("list", "--store", path)
    assert (code, err) == (0, "")
    header, first, second = out.splitlines()
    assert header.split() == [
        *("ID", "PROVIDER", "MODEL", "LANE", "STATE", "BATCH"),
        *("DONE", "FAILED", "OPEN", "COST", "CREATED"),
    ]
    assert first.split() == [
        new.id[:12],
        *("anthropic", "m", "batch", "submitted", "msgbatch_new"),
        *("0", "0", "2", "$0.0000", utc(new.created_at)),
    ]
    assert second.split() == [
        old.id[:12],
        *("openai", "m", "batch", "expired", "batch_old"),
        *("2", "1", "1", "$0.0125", utc(old.created_at)),
    ]
    assert header.index("BATCH") == first.index("msgbatch_new") == second.index("batch_old")
    assert header.index("COST") + 4 == first.index("$0.0000") + 7 == second.index("$0.0125") + 7
    assert utc(old.created_at).startswith("2025-01-01T00:00:")


def test_list_of_an_empty_store_says_so(path: Path, run: Run) -> None:
    JobStore(path).close()
    assert run("list", "--store", path) == (0, f"no jobs in the job store {path}\n", "")


def test_store_may_come_before_or_after_the_command(path: Path, run: Run) -> None:
    two_jobs(path)
    before = run("--store", path, "list")
    assert before[0] == 0
    assert before == run("list", "--store", path)


@pytest.mark.parametrize("command", ["list", "show", "results"])
def test_each_read_command_describes_itself_in_its_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["jobs", command, "--help"])
    lines = capsys.readouterr().out.splitlines()
    description = lines[lines.index("") + 1]
    assert description.endswith(".")
    assert len(description.split()) >= 3


def test_list_reads_the_default_store_from_the_environment(
    path: Path, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, _, _ = two_jobs(path)
    monkeypatch.setenv("COALESCE_STORE", str(path))
    code, out, _ = run("list")
    assert code == 0
    assert old.id[:12] in out


def test_a_missing_store_is_a_one_line_error_and_is_not_created(path: Path, run: Run) -> None:
    missing = path.parent / "nowhere" / "jobs.sqlite3"
    code, out, err = run("list", "--store", missing)
    assert (code, out) == (2, "")
    assert err == (
        f"coalesce jobs list: error: no job store at {missing} (no deferred job has run with"
        f" it); give --store the store file, or set $COALESCE_STORE\n"
    )
    assert not missing.parent.exists()


@pytest.mark.parametrize(
    ("content", "why"), [(b"", "it has no schema"), (b"not a database" * 100, "file is not")]
)
def test_a_file_that_is_not_a_store_is_refused_untouched(
    path: Path, run: Run, content: bytes, why: str
) -> None:
    path.write_bytes(content)
    code, _, err = run("show", "abcdef", "--store", path)
    assert code == 2
    assert err.startswith(f"coalesce jobs show: error: {path} is not a coalesce job store (")
    assert why in err
    assert err.count("\n") == 1
    assert path.read_bytes() == content
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_store_from_a_newer_coalesce_is_a_one_line_error(path: Path, run: Run) -> None:
    JobStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    code, _, err = run("list", "--store", path)
    assert code == 2
    assert err.startswith("coalesce jobs list: error: the job store ")
    assert "schema version 99" in err
    assert err.count("\n") == 1


# --- show ------------------------------------------------------------------------------


def test_show_prints_the_jobs_fields_counts_metadata_and_cost(path: Path, run: Run) -> None:
    old, _, _ = two_jobs(path)
    code, out, err = run("show", old.id, "--store", path)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"job         {old.id}",
        "provider    openai",
        "model       m",
        "lane        batch",
        "state       expired",
        "batch       batch_old",
        "input file  file-old",
        f"created     {utc(old.created_at)}",
        f"updated     {utc(old.updated_at)}",
        "cost        $0.0125 so far",
        "lines       3 in all: 1 done, 1 failed, 1 expired",
        "items       4 in all: 2 done, 1 failed, 1 released",
        "            released: let go unanswered, now pending or in a later job",
        f"metadata    coalesce_job = {old.id}",
        "            run = nightly",
    ]


def test_show_finds_a_job_by_prefix_and_by_batch_id(path: Path, run: Run) -> None:
    _, new, _ = two_jobs(path)
    by_id = run("show", new.id, "--store", path)
    assert by_id[0] == 0
    assert "items       2 in all: 2 assigned" in by_id[1]
    assert "- (not uploaded)" in by_id[1]
    assert run("show", new.id[:6], "--store", path) == by_id
    assert run("show", "msgbatch_new", "--store", path) == by_id


@pytest.mark.parametrize(
    ("wanted", "why"),
    [
        ("zzzzzzzz", ""),
        ("batch_nope", ""),
        ("ab", " (a prefix needs at least 6 characters)"),
    ],
)
def test_an_unknown_id_names_it_and_how_to_list_jobs(
    path: Path, run: Run, wanted: str, why: str
) -> None:
    two_jobs(path)
    assert run("show", wanted, "--store", path) == (
        2,
        "",
        f"coalesce jobs show: error: no job {wanted!r} in the job store {path}{why};"
        f" `coalesce jobs list --store {path}` lists them\n",
    )


def job(id: str, batch: str | None = None) -> BatchJob:
    return BatchJob(
        id, "openai", "m", "batch", "planned", None, batch, MappingProxyType({}), 0, 0, 0
    )


def test_an_ambiguous_prefix_names_every_match() -> None:
    jobs = [job("abcdef01"), job("abcdef02"), job("abcdff03")]
    with pytest.raises(JobsError, match=r"prefix 'abcdef' matches 2 jobs \(abcdef01, abcdef02\)"):
        resolve_job(jobs, "abcdef", Path("s"))
    assert resolve_job(jobs, "abcdef02", Path("s")) is jobs[1]
    assert resolve_job(jobs, "abcdff", Path("s")) is jobs[2]


def test_an_exact_id_or_batch_id_wins_over_a_prefix() -> None:
    jobs = [job("abcdef0123", "batch_1"), job("abcdef", "abcdef0123x")]
    assert resolve_job(jobs, "abcdef", Path("s")) is jobs[1]
    assert resolve_job(jobs, "abcdef0123x", Path("s")) is jobs[1]
    assert resolve_job(jobs, "batch_1", Path("s")) is jobs[0]


# --- results ---------------------------------------------------------------------------


def read_jsonl(file: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]


def test_results_writes_one_line_per_item_the_job_carried(
    path: Path, tmp_path: Path, run: Run
) -> None:
    old, new, keys = two_jobs(path)
    out = tmp_path / "old.jsonl"
    code, printed, err = run("results", "batch_old", "--out", out, "--store", path)
    assert (code, err) == (0, "")
    assert printed == (
        f"wrote 4 items of job {old.id} to {out} (4 in all: 2 done, 1 failed, 1 released)\n"
    )
    records = read_jsonl(out)
    common = {"function": "tag", "model": "m"}
    new_line = JobStore(path).job_lines(new.id)[0].custom_id
    assert records == [
        {
            **common,
            "key": keys[0],
            "input": {"ticket": 0},
            "state": "done",
            "result": {"tag": keys[0][:4]},
        },
        {
            **common,
            "key": keys[1],
            "input": {"ticket": 1},
            "state": "done",
            "result": {"tag": keys[1][:4]},
        },
        {
            **common,
            "key": keys[2],
            "input": {"ticket": 2},
            "state": "failed",
            "error": "invalid JSON",
        },
        {
            **common,
            "key": keys[3],
            "input": {"ticket": 3},
            "state": "released",
            "error": f"released by this job; the item is now assigned in line {new_line}",
        },
    ]


def test_results_of_an_unanswered_job_are_assigned_items(
    path: Path, tmp_path: Path, run: Run
) -> None:
    _, new, keys = two_jobs(path)
    out = tmp_path / "new.jsonl"
    assert run("results", new.id[:8], "--out", out, "--store", path)[0] == 0
    assert [(r["key"], r["state"], r["error"]) for r in read_jsonl(out)] == [
        (keys[3], "assigned", None),
        (keys[4], "assigned", None),
    ]


def test_results_refuses_to_overwrite_a_file_unless_forced(
    path: Path, tmp_path: Path, run: Run
) -> None:
    two_jobs(path)
    out = tmp_path / "kept.jsonl"
    out.write_text("precious\n")
    assert run("results", "batch_old", "--out", out, "--store", path) == (
        2,
        "",
        f"coalesce jobs results: error: {out} already exists; pass --force to overwrite it\n",
    )
    assert out.read_text() == "precious\n"
    code, _, _ = run("results", "batch_old", "--out", out, "--store", path, "--force")
    assert code == 0
    assert len(read_jsonl(out)) == 4


def test_results_into_a_missing_directory_is_a_one_line_error(
    path: Path, tmp_path: Path, run: Run
) -> None:
    two_jobs(path)
    out = tmp_path / "no" / "such" / "dir.jsonl"
    code, _, err = run("results", "batch_old", "--out", out, "--store", path)
    assert code == 2
    assert err.startswith(f"coalesce jobs results: error: cannot write {out} (")
    assert err.count("\n") == 1


def test_results_needs_out(path: Path, run: Run) -> None:
    with pytest.raises(SystemExit) as info:
        run("results", "batch_old", "--store", path)
    assert info.value.code == 2


# --- wiring ----------------------------------------------------------------------------


def test_python_dash_m_coalesce_jobs_list_reads_the_store(path: Path) -> None:
    old, new, _ = two_jobs(path)
    done = subprocess.run(
        [sys.executable, "-m", "coalesce", "jobs", "list", "--store", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COALESCE_STORE": str(path.parent / "not-this-one")},
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert [line.split()[0] for line in done.stdout.splitlines()] == [
        "ID",
        new.id[:12],
        old.id[:12],
    ]


def test_a_reader_that_leaves_early_ends_the_command_quietly(path: Path) -> None:
    # `coalesce jobs list | head -1`: the pipe's reader is gone before the table is
    # written (its read end is closed here before the command starts).
    two_jobs(path)
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "coalesce", "jobs", "list", "--store", str(path)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")  # as SIGPIPE would end it


def test_coalesce_help_lists_the_jobs_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "jobs" in capsys.readouterr().out

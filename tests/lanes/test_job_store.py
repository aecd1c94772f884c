"""The deferred lanes' durable job store: keys, atomic plans, restarts, kill -9, expiry.

No event loop: the store is synchronous (the runner calls it through a worker thread).
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import platformdirs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coalesce._exceptions import ConfigurationError, InvalidInputError
from coalesce._lanes.keys import item_key
from coalesce._lanes.records import BatchJob, ItemRow, PlannedLine, StoredItem, StoredLine
from coalesce._lanes.schema import SCHEMA_VERSION
from coalesce._lanes.store import JobStore
from coalesce._paths import default_store_path

SCHEMA = {"type": "object", "properties": {"tag": {"type": "string"}}}


def ticks() -> Callable[[], float]:
    """A wall clock that advances by one second per reading."""
    counter = itertools.count(1_000)
    return lambda: float(next(counter))


def row(n: int, *, function: str = "tag", model: str = "m") -> ItemRow:
    return ItemRow.for_call(function, model, "Tag the ticket.", SCHEMA, {"ticket": n})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "jobs.sqlite3", clock=ticks()) as opened:
        yield opened


def add(store: JobStore, count: int) -> list[str]:
    return store.add_items([row(n) for n in range(count)])


def line(store: JobStore, keys: list[str], custom_id: str | None = None) -> PlannedLine:
    cid = custom_id or store.new_custom_id()
    return PlannedLine(cid, {"custom_id": cid, "body": {"items": keys}}, keys)


def plan(store: JobStore, *groups: list[str]) -> BatchJob:
    return store.plan_job("openai", "m", "batch", [line(store, keys) for keys in groups])


def states(store: JobStore, keys: list[str]) -> list[str]:
    return [item.state for item in items(store, keys)]


def items(store: JobStore, keys: list[str]) -> list[StoredItem]:
    found = [store.get(key) for key in keys]
    assert all(item is not None for item in found)
    return [item for item in found if item is not None]


# --- keys ------------------------------------------------------------------------------


def test_item_key_is_a_sha256_hex_independent_of_dict_order() -> None:
    one = item_key("tag", "m", "Tag.", {"a": 1, "b": 2}, {"x": 1, "y": "é"})
    two = item_key("tag", "m", "Tag.", {"b": 2, "a": 1}, {"y": "é", "x": 1})
    assert one == two
    assert len(one) == 64
    assert int(one, 16) >= 0


def test_item_key_is_the_same_in_another_process() -> None:
    code = (
        "from coalesce._lanes.keys import item_key;"
        "print(item_key('tag', 'm', 'Tag.', {'type': 'object'}, {'text': 'naïve', 'n': [1, 2]}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    here = item_key("tag", "m", "Tag.", {"type": "object"}, {"n": [1, 2], "text": "naïve"})
    assert out.stdout.strip() == here


@pytest.mark.parametrize(
    "changed",
    [
        ("tag2", "m", "Tag.", {}, {"n": 1}),
        ("tag", "m2", "Tag.", {}, {"n": 1}),
        ("tag", "m", "Tag!", {}, {"n": 1}),
        ("tag", "m", "Tag.", {"type": "object"}, {"n": 1}),
        ("tag", "m", "Tag.", {}, {"n": 2}),
        ("tag", "m", "Tag.", {}, {"n": 1.0}),
        ("tag", "m", "Tag.", {}, {"n": "1"}),
    ],
)
def test_item_key_changes_with_each_of_the_five_parts(changed: tuple[Any, ...]) -> None:
    assert item_key(*changed) != item_key("tag", "m", "Tag.", {}, {"n": 1})


@settings(max_examples=50)
@given(
    st.lists(
        st.recursive(st.integers() | st.text(max_size=8), st.lists, max_leaves=5),
        min_size=2,
        max_size=10,
        unique_by=repr,
    )
)
def test_distinct_items_get_distinct_keys(values: list[Any]) -> None:
    keys = {item_key("tag", "m", "", {}, value) for value in values}
    assert len(keys) == len(values)


@pytest.mark.parametrize("bad", [float("nan"), b"bytes", object(), "\ud800"])
def test_item_key_refuses_what_is_not_json(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="not JSON"):
        item_key("tag", "m", "", {}, {"x": bad})


# --- items -----------------------------------------------------------------------------


def test_add_items_is_idempotent(store: JobStore) -> None:
    first = add(store, 3)
    again = store.add_items([row(0), row(1), row(2), row(1)])
    assert first == again == [row(n).key for n in range(3)]
    assert [item.input for item in store.pending_items()] == [{"ticket": n} for n in range(3)]


def test_add_items_returns_only_items_that_still_need_work(store: JobStore) -> None:
    keys = add(store, 4)
    plan(store, keys[:1], keys[1:3])
    lines = store.job_lines(store.list_jobs()[0].id)
    store.record_line_results([(lines[1].custom_id, {keys[1]: "ok"}, {keys[2]: "invalid"})])
    assert store.add_items([row(n) for n in range(5)]) == [keys[2], keys[3], row(4).key]


def test_pending_items_filters_by_function_and_failed(store: JobStore) -> None:
    keys = add(store, 2)
    other = store.add_items([row(9, function="summarise")])
    plan(store, keys[:1])
    cid = store.job_lines(store.list_jobs()[0].id)[0].custom_id
    store.record_line_results([(cid, {}, {keys[0]: "bad"})])
    assert [i.key for i in store.pending_items("tag")] == [keys[1]]
    assert [i.key for i in store.pending_items(include_failed=True)] == [keys[0], keys[1], *other]
    assert [i.key for i in store.pending_items("summarise")] == other


# --- plan_job ------------------------------------------------------------------------


def test_plan_job_writes_the_job_its_lines_and_assigns_the_items(store: JobStore) -> None:
    keys = add(store, 3)
    job = store.plan_job(
        "anthropic",
        "m",
        "batch",
        [line(store, keys[:2]), line(store, keys[2:])],
        metadata={"a": "b"},
    )
    assert (job.state, job.provider, job.lane, job.cost_usd) == ("planned", "anthropic", "batch", 0)
    assert dict(job.metadata) == {"a": "b", "coalesce_job": job.id}
    lines = store.job_lines(job.id)
    assert [ln.item_keys for ln in lines] == [tuple(keys[:2]), (keys[2],)]
    assert [(ln.state, ln.attempt) for ln in lines] == [("planned", 1), ("planned", 1)]
    assert lines[0].request == {"custom_id": lines[0].custom_id, "body": {"items": keys[:2]}}
    assert [(i.state, i.line, i.attempts) for i in items(store, keys)] == [
        ("assigned", lines[0].custom_id, 1),
        ("assigned", lines[0].custom_id, 1),
        ("assigned", lines[1].custom_id, 1),
    ]
    assert store.unfinished_jobs() == [job]


def snapshot(store: JobStore, keys: list[str]) -> tuple[Any, ...]:
    jobs = store.list_jobs()
    return jobs, [store.job_lines(job.id) for job in jobs], items(store, keys)


def test_plan_job_is_atomic_a_duplicate_custom_id_midway_leaves_nothing(store: JobStore) -> None:
    keys = add(store, 3)
    before = snapshot(store, keys)
    cid = store.new_custom_id()
    lines = [line(store, keys[:1], cid), line(store, keys[1:2]), line(store, keys[2:], cid)]
    with pytest.raises(ConfigurationError, match=f"custom_id '{cid}' already exists"):
        store.plan_job("openai", "m", "batch", lines)
    assert snapshot(store, keys) == before
    assert store.add_items([row(n) for n in range(3)]) == keys
    job = store.plan_job("openai", "m", "batch", lines[:2])
    assert [ln.custom_id for ln in store.job_lines(job.id)] == [cid, lines[1].custom_id]


def test_plan_job_refuses_a_custom_id_already_in_another_job(store: JobStore) -> None:
    keys = add(store, 2)
    job = plan(store, keys[:1])
    used = store.job_lines(job.id)[0].custom_id
    store.expire_line(used)
    with pytest.raises(ConfigurationError, match=f"custom_id '{used}' already exists"):
        store.plan_job("openai", "m", "batch", [line(store, keys, used)])
    assert states(store, keys) == ["pending", "pending"]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("assigned", "already assigned to the unfinished line"),
        ("done", "already has its result"),
        ("unknown", "is not in the store; add it with add_items"),
        ("model", "is for model 'm', not this job's 'other'"),
        ("twice", "already assigned to the unfinished line"),
    ],
)
def test_plan_job_refuses_an_item_that_cannot_go_in_a_line(
    store: JobStore, setup: str, message: str
) -> None:
    keys = add(store, 2)
    if setup in ("assigned", "done"):
        cid = store.job_lines(plan(store, keys[:1]).id)[0].custom_id
        if setup == "done":
            store.record_line_results([(cid, {keys[0]: 1}, {})])
    bad = {"unknown": "0" * 64}.get(setup, keys[0])
    model = "other" if setup == "model" else "m"
    carried = [keys[1], bad, bad] if setup == "twice" else [keys[1], bad]
    before = snapshot(store, keys)
    with pytest.raises(ConfigurationError, match=message):
        store.plan_job("openai", model, "batch", [line(store, carried)])
    assert snapshot(store, keys) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"provider": "azure"}, "provider='azure' is not one of openai, anthropic"),
        ({"lane": "realtime"}, "lane='realtime' is not one of batch, flex"),
        ({"lines": []}, "got no lines"),
        ({"metadata": {"coalesce_job": "x"}}, "reserved"),
    ],
)
def test_plan_job_refuses_bad_arguments(
    store: JobStore, kwargs: dict[str, Any], message: str
) -> None:
    keys = add(store, 1)
    args: dict[str, Any] = {"provider": "openai", "model": "m", "lane": "batch"}
    args["lines"] = [line(store, keys)]
    with pytest.raises(ConfigurationError, match=message):
        store.plan_job(**{**args, **kwargs})
    assert store.list_jobs() == []


def test_plan_job_refuses_a_line_without_items(store: JobStore) -> None:
    with pytest.raises(ConfigurationError, match="carries no items"):
        store.plan_job("openai", "m", "batch", [line(store, [])])
    assert store.list_jobs() == []


# --- upload and submit ------------------------------------------------------------------


def test_uploaded_then_submitted(store: JobStore) -> None:
    job = plan(store, add(store, 2))
    store.mark_uploaded(job.id, "file-1")
    store.mark_uploaded(job.id, "file-2")
    store.mark_submitted(job.id, "batch-1")
    store.mark_submitted(job.id, "batch-1")
    found = store.job_for_batch("batch-1")
    assert found is not None
    assert (found.id, found.state, found.input_file_id) == (job.id, "submitted", "file-2")
    assert [ln.state for ln in store.job_lines(job.id)] == ["submitted"]
    assert store.unfinished_jobs() == [found]
    assert store.job_for_batch("batch-2") is None


def test_a_submitted_job_cannot_be_uploaded_or_submitted_again(store: JobStore) -> None:
    keys = add(store, 2)
    job, other = plan(store, keys[:1]), plan(store, keys[1:])
    store.mark_submitted(job.id, "batch-1")
    with pytest.raises(ConfigurationError, match="already submitted"):
        store.mark_uploaded(job.id, "file-2")
    with pytest.raises(ConfigurationError, match="cannot also be batch batch-2"):
        store.mark_submitted(job.id, "batch-2")
    with pytest.raises(ConfigurationError, match=f"already recorded for job {job.id}"):
        store.mark_submitted(other.id, "batch-1")
    assert store.get_job(other.id) == other
    with pytest.raises(ConfigurationError, match="no job 'nope'"):
        store.mark_submitted("nope", "batch-3")


# --- results and expiry ---------------------------------------------------------------------


def test_record_line_result_settles_each_item(store: JobStore) -> None:
    keys = add(store, 3)
    job = plan(store, keys)
    cid = store.job_lines(job.id)[0].custom_id
    store.record_line_results([(cid, {keys[0]: {"tag": "billing"}}, {keys[1]: "invalid tag"})])
    got = items(store, keys)
    assert [(i.state, i.result, i.error) for i in got] == [
        ("done", {"tag": "billing"}, None),
        ("failed", None, "invalid tag"),
        ("pending", None, f"line {cid} gave no output for this item"),
    ]
    assert store.job_lines(job.id)[0].state == "done"
    store.record_line_results([(cid, {keys[0]: {"tag": "other"}}, {keys[1]: "invalid tag"})])
    again = items(store, keys)
    assert [(i.state, i.result, i.error, i.line) for i in again] == [
        (i.state, i.result, i.error, i.line) for i in got
    ]


def test_a_line_without_any_result_is_failed(store: JobStore) -> None:
    keys = add(store, 2)
    job = plan(store, keys)
    store.record_line_results([(store.job_lines(job.id)[0].custom_id, {}, {keys[0]: "x"})])
    assert store.job_lines(job.id)[0].state == "failed"


def test_record_line_result_refuses_keys_the_line_does_not_carry(store: JobStore) -> None:
    keys = add(store, 2)
    cid = store.job_lines(plan(store, keys[:1]).id)[0].custom_id
    with pytest.raises(ConfigurationError, match=f"does not carry items \\['{keys[1]}'\\]"):
        store.record_line_results([(cid, {keys[0]: 1, keys[1]: 2}, {})])
    with pytest.raises(ConfigurationError, match="both a result and a failure"):
        store.record_line_results([(cid, {keys[0]: 1}, {keys[0]: "x"})])
    with pytest.raises(ConfigurationError, match="no line 'nope'"):
        store.record_line_results([("nope", {}, {})])
    assert states(store, keys) == ["assigned", "pending"]


def test_expire_line_returns_its_unfinished_items_to_pending(store: JobStore) -> None:
    keys = add(store, 4)
    job = plan(store, keys[:2], keys[2:])
    first, second = (ln.custom_id for ln in store.job_lines(job.id))
    store.record_line_results([(first, {keys[0]: "a", keys[1]: "b"}, {})])
    assert store.expire_line(second) == keys[2:]
    assert store.expire_line(first) == []
    assert [ln.state for ln in store.job_lines(job.id)] == ["done", "expired"]
    assert states(store, keys) == ["done", "done", "pending", "pending"]
    assert [i.key for i in store.pending_items()] == keys[2:]
    follow_up = plan(store, keys[2:])
    assert [i.attempts for i in items(store, keys)] == [1, 1, 2, 2]
    assert store.job_lines(follow_up.id)[0].attempt == 2


def test_a_late_result_from_an_expired_line_is_kept(store: JobStore) -> None:
    keys = add(store, 2)
    old = store.job_lines(plan(store, keys).id)[0].custom_id
    store.expire_line(old)
    new = store.job_lines(plan(store, keys).id)[0].custom_id
    store.record_line_results([(old, {keys[0]: "early"}, {keys[1]: "late failure"})])
    assert [(i.state, i.line) for i in items(store, keys)] == [("done", old), ("assigned", new)]
    store.record_line_results([(new, {keys[0]: "second", keys[1]: "fine"}, {})])
    assert [i.result for i in items(store, keys)] == ["early", "fine"]


def test_finish_job_releases_its_unanswered_lines_and_records_cost(store: JobStore) -> None:
    keys = add(store, 3)
    job = plan(store, keys[:1], keys[1:])
    first = store.job_lines(job.id)[0].custom_id
    store.mark_submitted(job.id, "batch-1")
    store.record_line_results([(first, {keys[0]: "ok"}, {})])
    store.finish_job(job.id, "expired", cost_usd=0.25)
    store.finish_job(job.id, "expired")
    finished = store.get_job(job.id)
    assert finished is not None
    assert (finished.state, finished.cost_usd, finished.unfinished) == ("expired", 0.25, False)
    assert [ln.state for ln in store.job_lines(job.id)] == ["done", "expired"]
    assert states(store, keys) == ["done", "pending", "pending"]
    assert store.unfinished_jobs() == []
    with pytest.raises(ConfigurationError, match="already finished as expired"):
        store.finish_job(job.id, "completed")
    with pytest.raises(ConfigurationError, match="state='submitted' is not one of"):
        store.finish_job(job.id, "submitted")


def test_job_summary_counts_lines_and_items(store: JobStore) -> None:
    keys = add(store, 4)
    job = plan(store, keys[:2], keys[2:3], keys[3:])
    a, b, _ = (ln.custom_id for ln in store.job_lines(job.id))
    store.record_line_results([(a, {keys[0]: 1}, {keys[1]: "x"})])
    store.expire_line(b)
    plan(store, keys[2:3])
    store.finish_job(job.id, "cancelled", cost_usd=1.5)
    summary = store.job_summary(job.id)
    assert dict(summary.lines) == {
        "planned": 0,
        "submitted": 0,
        "done": 1,
        "failed": 0,
        "expired": 2,
    }
    assert dict(summary.items) == {"assigned": 0, "done": 1, "failed": 1, "released": 2}
    assert summary.cost_usd == 1.5
    assert store.list_jobs()[0].id == job.id


# --- durability --------------------------------------------------------------------------


def test_a_new_store_on_the_same_file_sees_everything(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    first = JobStore(path, clock=ticks())
    keys = add(first, 3)
    job = plan(first, keys[:2], keys[2:])
    first.mark_submitted(job.id, "batch-1")
    cid = first.job_lines(job.id)[0].custom_id
    first.record_line_results([(cid, {keys[0]: "a"}, {keys[1]: "b"})])
    seen = snapshot(first, keys)
    # No close(): a restart finds the store as the crashed process left it.
    second = JobStore(path)
    assert snapshot(second, keys) == seen
    assert second.unfinished_jobs() == [second.get_job(job.id)]
    assert second.new_custom_id() not in {ln.custom_id for ln in second.job_lines(job.id)}
    first.close()
    second.close()


CHILD = """
import sys
from coalesce._lanes.records import ItemRow, PlannedLine
from coalesce._lanes.store import JobStore
store = JobStore(sys.argv[1])
rows = [ItemRow.for_call("tag", "m", "Tag.", {}, {"n": n}) for n in range(3)]
keys = store.add_items(rows)
cid = store.new_custom_id()
job = store.plan_job("openai", "m", "batch", [PlannedLine(cid, {"n": 3}, keys)])
print(job.id, cid, flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_job_planned_survives_kill_9_right_after_plan_job(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    job_id, cid = child.stdout.readline().split()
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    child.stdout.close()
    assert child.stdin is not None
    child.stdin.close()
    with JobStore(path) as store:
        [job] = store.unfinished_jobs()
        assert (job.id, job.state) == (job_id, "planned")
        [stored] = store.job_lines(job_id)
        assert (stored.custom_id, stored.request, len(stored.item_keys)) == (cid, {"n": 3}, 3)
        assert states(store, list(stored.item_keys)) == ["assigned"] * 3


# --- opening --------------------------------------------------------------------------------


def test_a_store_from_a_newer_coalesce_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    JobStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(ConfigurationError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        JobStore(path)


@pytest.mark.parametrize("content", [b"not a database at all" * 100, None])
def test_a_file_that_is_not_a_job_store_is_refused(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "other.sqlite3"
    if content is None:
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE jobs (x)")
        db.close()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigurationError, match="is not a usable coalesce job store"):
        JobStore(path)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is not a usable coalesce job store"):
        JobStore(tmp_path)


def test_opening_creates_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "jobs.sqlite3"
    with JobStore(path) as store:
        assert repr(store) == f"<JobStore {str(path)!r} open>"
    assert path.exists()
    assert repr(store).endswith("closed>")


def test_the_default_store_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COALESCE_STORE", str(tmp_path / "mine.db"))
    assert default_store_path() == tmp_path / "mine.db"
    assert default_store_path({"COALESCE_STORE": "~/x/y.db"}) == Path.home() / "x/y.db"
    user_data = Path(platformdirs.user_data_dir("coalesce", appauthor=False))
    assert default_store_path({"COALESCE_STORE": ""}) == user_data / "jobs.sqlite3"
    monkeypatch.delenv("COALESCE_STORE")
    assert default_store_path() == user_data / "jobs.sqlite3"


# --- custom ids and threads -----------------------------------------------------------------


@settings(max_examples=25)
@given(st.lists(st.integers(min_value=0, max_value=2), max_size=60))
def test_new_custom_id_never_repeats_across_stores(which: list[int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        stores = [JobStore(Path(folder) / "jobs.sqlite3") for _ in range(3)]
        ids = [stores[n].new_custom_id() for n in which]
        for opened in stores:
            opened.close()
    assert len(set(ids)) == len(ids)
    assert all(0 < len(cid) <= 64 and set(cid) <= set("0123456789abcdef-") for cid in ids)


def test_threads_share_one_store(store: JobStore) -> None:
    ids: list[str] = []
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            keys = store.add_items([row(100 * n + k) for k in range(5)])
            store.plan_job("openai", "m", "batch", [line(store, keys)])
            ids.extend(store.new_custom_id() for _ in range(20))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.list_jobs()) == 8
    assert len(set(ids)) == 160


# --- the property: no custom_id reused, no item on two unfinished lines ---------------------

UNFINISHED = ("planned", "submitted")


class StoreMachine(RuleBasedStateMachine):
    """Random plans, expiries, results and ends, checked against the store's promises."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.TemporaryDirectory()
        self.store = JobStore(Path(self.folder.name) / "jobs.sqlite3", clock=ticks())
        self.keys = add(self.store, 6)
        self.issued: list[str] = []
        self.first_result: dict[str, Any] = {}
        self.results = itertools.count()

    def teardown(self) -> None:
        self.store.close()
        self.folder.cleanup()

    def fresh_id(self) -> str:
        cid = self.store.new_custom_id()
        self.issued.append(cid)
        return cid

    def all_lines(self) -> list[StoredLine]:
        return [ln for job in self.store.list_jobs() for ln in self.store.job_lines(job.id)]

    @rule(data=st.data())
    def plan(self, data: st.DataObject) -> None:
        keys = data.draw(st.lists(st.sampled_from(self.keys), min_size=1, max_size=4, unique=True))
        cut = data.draw(st.integers(min_value=1, max_value=len(keys)))
        ids = [self.fresh_id(), self.fresh_id()]
        used = [ln.custom_id for ln in self.all_lines()]
        reuse: bool = data.draw(st.booleans())
        if used and reuse:
            ids[data.draw(st.integers(0, 1))] = data.draw(st.sampled_from(used))
        groups = [keys[:cut], keys[cut:]] if cut < len(keys) else [keys]
        lines = [PlannedLine(cid, {"n": len(g)}, g) for cid, g in zip(ids, groups, strict=False)]
        plannable = all(item.state in ("pending", "failed") for item in items(self.store, keys))
        fresh = not {ln.custom_id for ln in lines} & set(used)
        before = snapshot(self.store, self.keys)
        try:
            self.store.plan_job("openai", "m", "batch", lines)
        except ConfigurationError:
            assert not (plannable and fresh)
            assert snapshot(self.store, self.keys) == before
        else:
            assert plannable
            assert fresh

    @precondition(lambda self: self.store.list_jobs())
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        chosen = data.draw(st.sampled_from(self.all_lines()))
        held = [i.key for i in self.store.pending_items()]
        released = self.store.expire_line(chosen.custom_id)
        assert not set(released) & set(held)
        assert all(self.store.get(key).state == "pending" for key in released)  # type: ignore[union-attr]

    @precondition(lambda self: self.store.list_jobs())
    @rule(data=st.data())
    def record(self, data: st.DataObject) -> None:
        chosen = data.draw(st.sampled_from(self.all_lines()))
        outcome = {key: data.draw(st.sampled_from("rfm")) for key in chosen.item_keys}
        results = {k: next(self.results) for k, o in outcome.items() if o == "r"}
        failures = {k: "bad" for k, o in outcome.items() if o == "f"}
        self.store.record_line_results([(chosen.custom_id, results, failures)])
        for key, value in results.items():
            self.first_result.setdefault(key, value)

    @precondition(lambda self: self.store.unfinished_jobs())
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self.store.unfinished_jobs()))
        if data.draw(st.booleans()):
            self.store.mark_submitted(job.id, f"batch-{job.id}")
        self.store.finish_job(job.id, data.draw(st.sampled_from(["completed", "expired"])))

    @invariant()
    def custom_ids_are_never_reused(self) -> None:
        stored = [ln.custom_id for ln in self.all_lines()]
        assert len(set(self.issued)) == len(self.issued)
        assert len(set(stored)) == len(stored)
        assert set(stored) <= set(self.issued)

    @invariant()
    def no_item_is_on_two_unfinished_lines(self) -> None:
        carried = [key for ln in self.all_lines() if ln.state in UNFINISHED for key in ln.item_keys]
        assert len(set(carried)) == len(carried)
        holders = {ln.custom_id: ln for ln in self.all_lines()}
        for item in items(self.store, self.keys):
            if item.state == "assigned":
                assert item.line is not None
                assert holders[item.line].state in UNFINISHED
                assert item.key in holders[item.line].item_keys
            assert (item.state == "pending") == (item.line is None)

    @invariant()
    def a_result_is_never_lost_or_replaced(self) -> None:
        for item in items(self.store, self.keys):
            assert (item.state == "done") == (item.key in self.first_result)
            if item.state == "done":
                assert item.result == self.first_result[item.key]


StoreMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25)
TestStoreProperties = StoreMachine.TestCase

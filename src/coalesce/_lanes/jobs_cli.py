"""``coalesce jobs``: the job store from the command line.

``list``, ``show`` and ``results`` only read: a store path that does not exist, or a
file that is not a coalesce job store, is a one-line error (exit code 2), never a new
empty store. ``wait``, ``cancel`` and ``resume`` also talk to the provider, through
:mod:`coalesce._lanes.jobs_live`, and record what they learn in the (existing) store;
``resume`` also sends again, in a follow-up job, the lines that got no answer.
Deciding and formatting are pure functions of records; :func:`main` does the I/O, and
ends quietly when the reader of its output leaves early (:func:`emit`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, closing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio

from coalesce._exceptions import ConfigurationError
from coalesce._lanes.jobs_live import (
    PROGRAM_HINT,
    RESUME_HINT,
    Connection,
    Display,
    ProviderFailure,
    batch_id_of,
    cancel_job,
    check_base_url,
    connect,
    follow_up_lines,
    outcome_line,
    plan_follow_ups,
    resume_job,
    wait_job,
)
from coalesce._lanes.records import BatchJob, JobSummary, Provider, StoredItem
from coalesce._lanes.results import POLL_INTERVAL, Poll
from coalesce._lanes.store import JobStore
from coalesce._options import MAX_ATTEMPTS
from coalesce._paths import default_store_path

__all__ = [
    "BROKEN_PIPE",
    "LIVE_COMMANDS",
    "build_parser",
    "describe_job",
    "emit",
    "job_table",
    "main",
    "resolve_job",
    "result_record",
    "run_command",
]

MIN_PREFIX = 6
"""The shortest local-id prefix ``show`` and ``results`` accept."""

SHORT_ID = 12
"""How many characters of the local id ``list`` shows."""

_ID_HELP = f"local job id, a unique prefix of it (>= {MIN_PREFIX} characters), or provider batch id"

LIVE_COMMANDS = frozenset({"wait", "cancel", "resume"})
"""The commands that talk to the provider (the others only read the store)."""

BROKEN_PIPE = 128 + 13
"""The exit code when stdout's reader left early: that of a command ended by SIGPIPE."""

_LIVE_EPILOG = (
    "wait, cancel and resume need the provider's API key: OPENAI_API_KEY or"
    " ANTHROPIC_API_KEY, as the job's provider requires (OPENAI_BASE_URL and"
    " ANTHROPIC_BASE_URL, or --base-url, for another endpoint). They check each result"
    " only as JSON: the decorated function validates it against its output type when it"
    " reads the store."
)


_READ_HELPS = {
    "list": "every job, newest first (OPEN: items the job has not answered)",
    "show": "one job in full",
    "results": "write one JSON line per item the job carried",
}


class JobsError(Exception):
    """A one-line error of ``coalesce jobs``, printed to stderr with exit code 2."""


# --- arguments ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``coalesce jobs``."""
    store_help = f"the job store file (default: $COALESCE_STORE or {default_store_path()})"
    parser = argparse.ArgumentParser(
        prog="coalesce jobs",
        description="Read the deferred lanes' job store; wait for, cancel or resume its jobs.",
        epilog=_LIVE_EPILOG,
    )
    # --store goes before the command or after it: the command's own copy leaves the
    # value alone when not given (SUPPRESS), so `jobs --store X list` keeps X.
    parser.add_argument("--store", type=Path, help=store_help)
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", type=Path, default=argparse.SUPPRESS, help=store_help)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in _READ_HELPS.items():
        command = commands.add_parser(name, parents=[store], help=text, description=f"{text}.")
        if name != "list":
            command.add_argument("id", metavar="ID", help=_ID_HELP)
    results = commands.choices["results"]
    results.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    results.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    _add_live_commands(commands, store)
    return parser


def _add_live_commands(commands: Any, store: argparse.ArgumentParser) -> None:
    live = argparse.ArgumentParser(add_help=False, parents=[store])
    live.add_argument(
        "--base-url",
        help="the provider's API root (default: $OPENAI_BASE_URL or $ANTHROPIC_BASE_URL)",
    )
    live.add_argument(
        "--poll",
        type=_seconds,
        default=POLL_INTERVAL,
        metavar="SECONDS",
        help=f"longest wait between polls, backing off from 5 s (default: {POLL_INTERVAL:g})",
    )
    helps = {
        "wait": "poll the job's batch until it is final (progress on stderr), collect its"
        " results into the store, and show the job with its cost so far",
        "cancel": "cancel the job's batch at the provider; what it finished is collected,"
        " its other items stay pending for a follow-up job",
        "resume": "finish every unfinished job: submit what was planned and never"
        " submitted (never twice), wait for what was, and collect the results",
    }
    for name, text in helps.items():
        command = commands.add_parser(
            name, parents=[live], help=text, description=f"{text}.", epilog=_LIVE_EPILOG
        )
        if name == "resume":
            command.add_argument(
                "--provider", choices=("openai", "anthropic"), help="only this provider's jobs"
            )
            command.add_argument(
                "--max-attempts",
                type=_count,
                default=MAX_ATTEMPTS,
                metavar="N",
                help="most lines one item is sent in, follow-ups included"
                f" (default: {MAX_ATTEMPTS}, as @coalesce.prompt's max_attempts)",
            )
        else:
            command.add_argument("id", metavar="ID", help=_ID_HELP)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


# --- pure decisions and formatting ---------------------------------------------------


def resolve_job(jobs: Sequence[BatchJob], wanted: str, store: Path) -> BatchJob:
    """The job ``wanted`` names: its local id, a unique prefix of it, or its batch id.

    Raises:
        JobsError: no job matches, or a prefix matches several.
    """
    exact = [job for job in jobs if wanted in (job.id, job.provider_batch_id)]
    if exact:
        return exact[0]
    found = [job for job in jobs if len(wanted) >= MIN_PREFIX and job.id.startswith(wanted)]
    if len(found) == 1:
        return found[0]
    hint = f"`coalesce jobs list --store {store}` lists them"
    if found:
        ids = ", ".join(job.id for job in found)
        raise JobsError(f"job id prefix {wanted!r} matches {len(found)} jobs ({ids}); {hint}")
    short = (
        f" (a prefix needs at least {MIN_PREFIX} characters)" if len(wanted) < MIN_PREFIX else ""
    )
    raise JobsError(f"no job {wanted!r} in the job store {store}{short}; {hint}")


def utc(timestamp: float) -> str:
    """Wall-clock seconds as UTC ISO 8601, to the second (``2025-01-31T12:00:00Z``)."""
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _open_items(items: Mapping[str, int]) -> int:
    return items.get("assigned", 0) + items.get("released", 0)


_COLUMNS = ("ID", "PROVIDER", "MODEL", "LANE", "STATE", "BATCH", "DONE", "FAILED", "OPEN")
_NUMERIC = frozenset({"DONE", "FAILED", "OPEN", "COST"})


def job_table(summaries: Sequence[JobSummary]) -> list[str]:
    """``coalesce jobs list``'s lines: a header and one aligned row per job, in order."""
    header = (*_COLUMNS, "COST", "CREATED")
    rows = [header, *(_row(summary) for summary in summaries)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(width) if name in _NUMERIC else cell.ljust(width)
            for name, cell, width in zip(header, row, widths, strict=True)
        ).rstrip()
        for row in rows
    ]


def _row(summary: JobSummary) -> tuple[str, ...]:
    job, items = summary.job, summary.items
    return (
        job.id[:SHORT_ID],
        job.provider,
        job.model,
        job.lane,
        job.state,
        job.provider_batch_id or "-",
        str(items.get("done", 0)),
        str(items.get("failed", 0)),
        str(_open_items(items)),
        f"${summary.cost_usd:.4f}",
        utc(job.created_at),
    )


def describe_job(summary: JobSummary) -> list[str]:
    """``coalesce jobs show``'s lines: the job's fields, counts, metadata and cost."""
    job = summary.job
    fields = [
        ("job", job.id),
        ("provider", job.provider),
        ("model", job.model),
        ("lane", job.lane),
        ("state", job.state),
        ("batch", job.provider_batch_id or "- (not submitted)"),
        ("input file", job.input_file_id or "- (not uploaded)"),
        ("created", utc(job.created_at)),
        ("updated", utc(job.updated_at)),
        ("cost", f"${summary.cost_usd:.4f} so far"),
        ("lines", _counts(summary.lines.items())),
        ("items", _counts(summary.items.items())),
    ]
    if summary.items.get("released", 0):
        fields.append(("", "released: let go unanswered, now pending or in a later job"))
    metadata = [f"{key} = {value}" for key, value in sorted(job.metadata.items())]
    fields += [("metadata" if i == 0 else "", entry) for i, entry in enumerate(metadata)]
    width = max(len(name) for name, _ in fields)
    return [f"{name.ljust(width)}  {value}".rstrip() for name, value in fields]


def _counts(counts: Iterable[tuple[str, int]]) -> str:
    """``3 in all: 2 done, 1 failed``, from ``(state, count)`` pairs, naming only the
    states that have any."""
    pairs = list(counts)
    parts = [f"{n} {state}" for state, n in pairs if n]
    total = sum(n for _, n in pairs)
    return f"{total} in all" + (f": {', '.join(parts)}" if parts else "")


def result_record(item: StoredItem, job_lines: frozenset[str]) -> dict[str, Any]:
    """One line of ``coalesce jobs results``: an item as the job it came from sees it.

    An item whose line is not one of ``job_lines`` was let go by this job (its batch
    expired, or its line did not answer it): its state is ``released``, as in
    :class:`~coalesce._lanes.records.JobSummary`, and the job that answers it has its result.
    """
    record: dict[str, Any] = {
        "key": item.key,
        "function": item.function,
        "model": item.model,
        "input": item.input,
    }
    if item.line not in job_lines:
        where = f" in line {item.line}" if item.line else ""
        note = f"released by this job; the item is now {item.state}{where}"
        return {**record, "state": "released", "error": note}
    if item.state == "done":
        return {**record, "state": "done", "result": item.result}
    return {**record, "state": item.state, "error": item.error}


# --- I/O -----------------------------------------------------------------------------


def open_existing(path: Path) -> JobStore:
    """Open a job store that exists, never creating one.

    Raises:
        JobsError: no file at ``path``, or it is not a coalesce job store.
    """
    if not path.is_file():
        raise JobsError(
            f"no job store at {path} (no deferred job has run with it); give --store the"
            f" store file, or set $COALESCE_STORE"
        )
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as exc:
        raise JobsError(f"{path} is not a coalesce job store ({exc}); check --store") from exc
    if version == 0:
        raise JobsError(f"{path} is not a coalesce job store (it has no schema); check --store")
    return JobStore(path)


def _list(store: JobStore) -> list[str]:
    jobs = store.list_jobs()[::-1]
    if not jobs:
        return [f"no jobs in the job store {store.path}"]
    return job_table([store.job_summary(job.id) for job in jobs])


def _show(store: JobStore, wanted: str) -> list[str]:
    job = resolve_job(store.list_jobs(), wanted, store.path)
    return describe_job(store.job_summary(job.id))


def _carried(store: JobStore, job: BatchJob) -> tuple[frozenset[str], list[StoredItem]]:
    """The custom_ids of a job's lines, and the items they carried, in line order."""
    lines = store.job_lines(job.id)
    keys = dict.fromkeys(key for line in lines for key in line.item_keys)
    items = [item for item in map(store.get, keys) if item is not None]
    return frozenset(line.custom_id for line in lines), items


def _results(store: JobStore, wanted: str, out: Path, *, force: bool) -> list[str]:
    job = resolve_job(store.list_jobs(), wanted, store.path)
    custom_ids, items = _carried(store, job)
    records = [result_record(item, custom_ids) for item in items]
    _write_jsonl(out, records, force=force)
    states = _counts(Counter(record["state"] for record in records).items())
    return [f"wrote {len(records)} items of job {job.id} to {out} ({states})"]


def _write_jsonl(out: Path, records: Sequence[Mapping[str, Any]], *, force: bool) -> None:
    try:
        with out.open("w" if force else "x", encoding="utf-8") as file:
            for record in records:
                file.write(json.dumps(record, ensure_ascii=False) + "\n")
    except FileExistsError:
        raise JobsError(f"{out} already exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise JobsError(f"cannot write {out} ({exc.strerror or exc}); check --out") from exc


def _run(args: argparse.Namespace) -> list[str]:
    with open_existing(args.store or default_store_path()) as store:
        if args.command == "list":
            return _list(store)
        if args.command == "show":
            return _show(store, args.id)
        return _results(store, args.id, args.out, force=args.force)


async def _run_live(args: argparse.Namespace) -> list[str]:
    with open_existing(args.store or default_store_path()) as store:
        if args.command == "resume":
            return await _resume(store, args)
        job = resolve_job(store.list_jobs(), args.id, store.path)
        if not job.unfinished and args.command == "wait":
            return [f"job {job.id} already ended; nothing to wait for", *_show(store, job.id)]
        if not job.unfinished:
            raise JobsError(f"job {job.id} already ended ({job.state}); there is nothing to cancel")
        batch_id_of(job, "wait for" if args.command == "wait" else "cancel")
        act = wait_job if args.command == "wait" else cancel_job
        async with connect(job.provider, args.base_url) as conn:
            with conn.calls():
                outcome = await act(store, conn, job, Poll.every(args.poll), _display(job))
        # A cancelled job's items are the program's to ask again; resume asks the rest.
        hint = PROGRAM_HINT if outcome.state == "cancelled" else RESUME_HINT
        return [outcome_line(job, outcome, hint), *_show(store, job.id)]


async def _resume(store: JobStore, args: argparse.Namespace) -> list[str]:
    jobs = [job for job in store.unfinished_jobs() if args.provider in (None, job.provider)]
    sources = [job for job, _ in follow_up_lines(store, args.max_attempts, args.provider)]
    if not jobs and not sources:
        where = f" for {args.provider}" if args.provider else ""
        return [f"no unfinished jobs{where} in the job store {store.path}", *_pending(store)]
    providers = list(dict.fromkeys(job.provider for job in [*jobs, *sources]))
    check_base_url(providers, args.base_url)
    async with AsyncExitStack() as stack:
        # Every client first: a missing key stops the command before anything is sent.
        conns = {p: await stack.enter_async_context(connect(p, args.base_url)) for p in providers}
        lines = await _finish_all(store, conns, jobs, args.poll, "")
        follow_ups = plan_follow_ups(store, args.max_attempts, args.provider)
        lines += [
            f"follow-up {line}"
            for line in await _finish_all(store, conns, follow_ups, args.poll, RESUME_HINT)
        ]
    shown = [store.job_summary(job.id) for job in [*jobs, *follow_ups]]
    return [*lines, *_pending(store), "", *job_table(shown)]


async def _finish_all(
    store: JobStore,
    conns: Mapping[Provider, Connection],
    jobs: Sequence[BatchJob],
    poll: float,
    hint: str,
) -> list[str]:
    """Take each of ``jobs`` to its end, in order; what each gave."""
    lines = []
    for job in jobs:
        conn = conns[job.provider]
        with conn.calls():
            outcome = await resume_job(store, conn, job, Poll.every(poll), _display(job))
        lines.append(outcome_line(job, outcome, hint))
    return lines


def _pending(store: JobStore) -> list[str]:
    """A note on the items still pending that ``resume`` does not ask again."""
    count = len(store.pending_items())
    if not count:
        return []
    return [
        f"{count} items are still pending that resume does not ask again (their line was"
        f" answered in part, their job was cancelled, or they were asked --max-attempts"
        f" times): the program asks them when it runs again with the same calls"
    ]


def _display(job: BatchJob) -> Display:
    return Display(sys.stderr, f"job {job.id[:SHORT_ID]}")


def _failed(command: str, exc: Exception) -> int:
    print(f"coalesce jobs {command}: error: {exc}", file=sys.stderr)
    return 1 if isinstance(exc, ProviderFailure) else 2


async def run_command(args: argparse.Namespace) -> int:
    """Run ``wait``, ``cancel`` or ``resume`` in the running event loop (asyncio or trio);
    the exit code, as :func:`main`'s."""
    try:
        lines = await _run_live(args)
    except (JobsError, ConfigurationError, ProviderFailure) as exc:
        return _failed(args.command, exc)
    return emit(lines)


def emit(lines: Sequence[str]) -> int:
    """Print ``lines`` to stdout; the exit code: 0, or :data:`BROKEN_PIPE` when the
    reader left early (``coalesce jobs list | head -1``).

    A closed pipe ends the command quietly, as SIGPIPE ends other commands: stdout is
    pointed at ``/dev/null`` so that the interpreter's last flush finds nowhere to
    fail, and no traceback is printed.
    """
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return BROKEN_PIPE
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``coalesce jobs``; returns the exit code.

    2, with a one-line error, on a bad ID, a missing store, an unwritable ``--out`` or a
    missing API key; 1 when the provider's API fails; 130 when interrupted (the batch
    goes on at the provider, and ``wait`` or ``resume`` attaches to it again); 141
    (:data:`BROKEN_PIPE`), quietly, when stdout's reader left early.
    """
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command in LIVE_COMMANDS:
        try:
            return anyio.run(run_command, args)
        except KeyboardInterrupt:
            print(
                f"\ncoalesce jobs {args.command}: interrupted; the batch goes on at the"
                f" provider: `coalesce jobs wait ID` or `coalesce jobs resume` attaches again",
                file=sys.stderr,
            )
            return 130
    try:
        lines = _run(args)
    except (JobsError, ConfigurationError) as exc:
        return _failed(args.command, exc)
    return emit(lines)

"""``coalesce jobs wait | cancel | resume`` (issue 14, point 5), against the simulated
provider over real HTTP, through the official SDK clients the commands build from the
environment.

The simulator serves both batch APIs on a loopback port, on the real clock, with every
duration scaled down a thousandfold (the 24 h window is 86 s; a batch ends within tens of
milliseconds). Tests wait on conditions, never on time, and assert nothing about timing.
Submissions are counted on the provider's side (``sim.batch_submissions``).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from _batch_jobs import TIMING, plan, texts
from coalesce._lanes import anthropic_jobs, jobs_cli, openai_jobs
from coalesce._lanes.jobs_cli import build_parser, run_command
from coalesce._lanes.jobs_live import (
    Display,
    Progress,
    check_base_url,
    duration,
    json_value,
    progress_line,
)
from coalesce._lanes.records import BatchJob
from coalesce._lanes.results import Poll
from coalesce._lanes.store import JobStore
from coalesce.cli import main
from coalesce.providers import AnthropicProvider, OpenAIProvider
from coalesce.testing import SimulatedProvider

Run = Callable[..., Any]
#: The polls of ``--poll 0.005``: the simulator's durations are scaled down a thousandfold.
FAST_POLL = Poll.every(0.005)
SUBMIT = {"openai": openai_jobs.submit, "anthropic": anthropic_jobs.submit}


@pytest.fixture
def anyio_backend(real_time_backend: Any) -> Any:
    return real_time_backend


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.sqlite3"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[SimulatedProvider, str]]:
    """One simulator served on loopback for the module (each test resets it)."""
    sim = SimulatedProvider(batches=TIMING, time_scale=0.001)
    with sim.serve() as base:
        yield sim, base


@pytest.fixture
def sim(served: tuple[SimulatedProvider, str]) -> SimulatedProvider:
    served[0].reset()
    return served[0]


@pytest.fixture
def url(
    served: tuple[SimulatedProvider, str], sim: SimulatedProvider, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The simulator's root URL, and the environment the SDK clients read."""
    base = served[1]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-simulated")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{base}/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-simulated")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base)
    return base


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """``coalesce jobs ARGV...`` in the running event loop: (exit code, stdout, stderr)."""

    async def run(*argv: str | Path) -> tuple[int, str, str]:
        args = build_parser().parse_args([*map(str, argv), "--poll", "0.005"])
        with anyio.fail_after(30):  # a guard against a hang, not a clock
            code = await run_command(args)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def planned(
    path: Path, sim: SimulatedProvider, kind: str, n: int = 9, per_line: int = 3
) -> BatchJob:
    """A job planned in the store at ``path`` and not submitted."""
    provider: OpenAIProvider | AnthropicProvider = (
        OpenAIProvider(sim.openai_client())
        if kind == "openai"
        else AnthropicProvider(sim.anthropic_client())
    )
    with JobStore(path) as store:
        return plan(store, provider, texts(n, kind), per_line)


async def submitted(path: Path, sim: SimulatedProvider, url: str, kind: str) -> BatchJob:
    """A job planned and submitted over HTTP by another process, which then stopped."""
    job = planned(path, sim, kind)
    client = sim.openai_client(url) if kind == "openai" else sim.anthropic_client(url)
    async with client:
        with JobStore(path) as store:
            await SUBMIT[kind](store, client, job, FAST_POLL)
            again = store.get_job(job.id)
    assert again is not None
    return again


def counts(path: Path, job: BatchJob) -> dict[str, int]:
    with JobStore(path) as store:
        return {state: n for state, n in store.job_summary(job.id).items.items() if n}


# --- wait ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_wait_collects_every_result_of_a_submitted_job(
    path: Path, sim: SimulatedProvider, url: str, run: Run, kind: str
) -> None:
    job = await submitted(path, sim, url, kind)
    code, out, err = await run("wait", job.id[:8], "--store", path)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"job {job.id} completed: 9 results, 0 failed"
    assert "state       completed" in lines
    assert "items       9 in all: 9 done" in lines
    assert any(line.startswith("cost        $") and line.endswith(" so far") for line in lines)
    assert counts(path, job) == {"done": 9}
    assert len(sim.batch_submissions) == 1
    # stderr is not a terminal here: plain lines, the last one the final state.
    progress = err.splitlines()
    assert all(line.startswith(f"job {job.id[:12]}: ") for line in progress)
    final = "completed" if kind == "openai" else "ended"
    assert progress[-1].startswith(f"job {job.id[:12]}: {final}, 3/3 lines done, ")


@pytest.mark.anyio
async def test_wait_takes_the_base_url_from_the_command_line(
    path: Path, sim: SimulatedProvider, url: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await submitted(path, sim, url, "openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nobody listens there
    code, out, _ = await run("wait", job.id, "--store", path, "--base-url", f"{url}/v1")
    assert code == 0
    assert out.startswith(f"job {job.id} completed: 9 results")


@pytest.mark.anyio
async def test_wait_on_a_finished_job_shows_it_without_asking_the_provider(
    path: Path, sim: SimulatedProvider, url: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await submitted(path, sim, url, "openai")
    assert (await run("wait", job.id, "--store", path))[0] == 0
    monkeypatch.delenv("OPENAI_API_KEY")  # no client can be built: none is
    code, out, err = await run("wait", job.id, "--store", path)
    assert (code, err) == (0, "")
    assert out.splitlines()[:2] == [
        f"job {job.id} already ended; nothing to wait for",
        f"job         {job.id}",
    ]
    assert "items       9 in all: 9 done" in out


@pytest.mark.anyio
async def test_a_batch_the_provider_does_not_know_is_a_provider_error(
    path: Path, sim: SimulatedProvider, url: str, run: Run
) -> None:
    job = planned(path, sim, "openai")
    with JobStore(path) as store:
        store.mark_submitted(job.id, "batch_unknown")
    code, out, err = await run("wait", job.id, "--store", path)
    assert (code, out) == (1, "")
    assert err == (
        "coalesce jobs wait: error: the openai API failed: Error code: 404 - no batch with"
        " id 'batch_unknown'. Nothing recorded is lost: check OPENAI_API_KEY and"
        " OPENAI_BASE_URL (or --base-url), then run the command again\n"
    )
    assert counts(path, job) == {"assigned": 9}


# --- cancel ----------------------------------------------------------------------------


async def one_line_done(sim: SimulatedProvider, url: str, kind: str, batch_id: str) -> None:
    """Wait (on the condition, not the clock) until the batch has finished one line."""
    client = sim.openai_client(url) if kind == "openai" else sim.anthropic_client(url)
    async with client:
        while True:
            if kind == "openai":
                batch: Any = await client.batches.retrieve(batch_id)  # type: ignore[union-attr]
                done = batch.request_counts.completed if batch.request_counts else 0
            else:
                batch = await client.messages.batches.retrieve(batch_id)  # type: ignore[union-attr]
                done = batch.request_counts.succeeded
            if done:
                return
            await anyio.sleep(0.005)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_cancel_keeps_finished_results_and_leaves_the_rest_pending(
    path: Path, sim: SimulatedProvider, url: str, run: Run, kind: str
) -> None:
    sim.expire_next_batch(after_lines=1)  # one line answers, then the batch stalls
    job = await submitted(path, sim, url, kind)
    assert job.provider_batch_id is not None
    with anyio.fail_after(30):
        await one_line_done(sim, url, kind, job.provider_batch_id)
    code, out, _ = await run("cancel", job.id, "--store", path)
    assert code == 0
    assert out.splitlines()[0] == (
        f"job {job.id} cancelled: 3 results, 0 failed, 6 unanswered and pending again"
        f" (run the program again: its batch lane asks them in a follow-up job)"
    )
    assert "state       cancelled" in out
    assert counts(path, job) == {"done": 3, "released": 6}
    with JobStore(path) as store:
        assert len(store.pending_items()) == 6
        assert store.unfinished_jobs() == []
    assert len(sim.batch_submissions) == 1


@pytest.mark.anyio
async def test_cancel_of_a_finished_job_is_a_one_line_error(
    path: Path, sim: SimulatedProvider, url: str, run: Run
) -> None:
    job = await submitted(path, sim, url, "openai")
    await run("wait", job.id, "--store", path)
    assert await run("cancel", job.id, "--store", path) == (
        2,
        "",
        f"coalesce jobs cancel: error: job {job.id} already ended (completed);"
        f" there is nothing to cancel\n",
    )


# --- resume ----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_resume_submits_a_planned_job_once_and_a_second_resume_nothing(
    path: Path, sim: SimulatedProvider, url: str, run: Run, kind: str
) -> None:
    job = planned(path, sim, kind)
    code, out, _ = await run("resume", "--store", path)
    assert code == 0
    assert out.splitlines()[0] == f"job {job.id} completed: 9 results, 0 failed"
    assert counts(path, job) == {"done": 9}
    (submission,) = sim.batch_submissions
    assert len(submission.custom_ids) == 3
    assert await run("resume", "--store", path) == (
        0,
        f"no unfinished jobs in the job store {path}\n",
        "",
    )
    assert len(sim.batch_submissions) == 1


@pytest.mark.anyio
async def test_resume_attaches_to_submitted_jobs_and_submits_planned_ones_of_both_providers(
    path: Path, sim: SimulatedProvider, url: str, run: Run
) -> None:
    running = await submitted(path, sim, url, "openai")  # its process stopped while polling
    waiting = planned(path, sim, "anthropic", n=4, per_line=2)  # stopped before submitting
    code, out, _ = await run("resume", "--store", path)
    assert code == 0
    lines = out.splitlines()
    assert lines[:2] == [
        f"job {running.id} completed: 9 results, 0 failed",
        f"job {waiting.id} completed: 4 results, 0 failed",
    ]
    assert [row.split()[0] for row in lines[3:]] == ["ID", running.id[:12], waiting.id[:12]]
    with JobStore(path) as store:
        resumed = store.get_job(waiting.id)
    assert resumed is not None
    assert [s.batch_id for s in sim.batch_submissions] == [
        running.provider_batch_id,
        resumed.provider_batch_id,
    ]
    assert counts(path, running) == {"done": 9}
    assert counts(path, waiting) == {"done": 4}


@pytest.mark.anyio
async def test_resume_of_one_provider_leaves_the_others_jobs(
    path: Path, sim: SimulatedProvider, url: str, run: Run
) -> None:
    planned(path, sim, "openai")
    other = planned(path, sim, "anthropic")
    code, _, _ = await run(
        "resume", "--store", path, "--provider", "openai", "--base-url", url + "/v1"
    )
    assert code == 0
    with JobStore(path) as store:
        assert [job.id for job in store.unfinished_jobs()] == [other.id]
    assert [s.provider for s in sim.batch_submissions] == ["openai"]


# --- one-line errors, before anything is sent ------------------------------------------


@pytest.fixture
def jobs(capsys: pytest.CaptureFixture[str]) -> Run:
    """``coalesce jobs ARGV...`` through ``coalesce.cli.main``: (exit code, stdout, stderr)."""

    def jobs(*argv: str | Path) -> tuple[int, str, str]:
        code = main(["jobs", *map(str, argv)])
        out, err = capsys.readouterr()
        return code, out, err

    return jobs


def test_coalesce_jobs_resume_runs_in_an_event_loop_of_its_own(
    path: Path, sim: SimulatedProvider, url: str, jobs: Run
) -> None:
    job = planned(path, sim, "openai")
    code, out, err = jobs("resume", "--store", path, "--poll", "0.005")
    assert code == 0
    assert out.splitlines()[0] == f"job {job.id} completed: 9 results, 0 failed"
    assert err.splitlines()[-1].startswith(f"job {job.id[:12]}: completed, 3/3 lines done, ")
    assert len(sim.batch_submissions) == 1


def test_an_interrupt_says_the_batch_goes_on(
    path: Path, jobs: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs_cli, "run_command", interrupted)
    code, out, err = jobs("wait", "abcdef", "--store", path)
    assert (code, out) == (130, "")
    assert err == (
        "\ncoalesce jobs wait: interrupted; the batch goes on at the provider: `coalesce jobs"
        " wait ID` or `coalesce jobs resume` attaches again\n"
    )


@pytest.mark.parametrize(
    ("kind", "variable"), [("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")]
)
def test_a_missing_api_key_names_its_variable(
    path: Path, jobs: Run, monkeypatch: pytest.MonkeyPatch, kind: str, variable: str
) -> None:
    sim = SimulatedProvider()
    job = planned(path, sim, kind)
    monkeypatch.delenv(variable, raising=False)
    for command in (["resume"], ["wait", job.id]):
        if command[0] == "wait":
            with JobStore(path) as store:
                store.mark_submitted(job.id, "batch_x")
        code, out, err = jobs(*command, "--store", path)
        assert (code, out) == (2, "")
        assert err == (
            f"coalesce jobs {command[0]}: error: {variable} is not set, and the job is on"
            f" {kind}'s batch API: export {variable} (the key of the account the job belongs"
            f" to)\n"
        )
    assert sim.batch_submissions == ()


def test_an_empty_api_key_is_a_missing_one(
    path: Path, jobs: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned(path, SimulatedProvider(), "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "")
    code, _, err = jobs("resume", "--store", path)
    assert code == 2
    assert err.startswith("coalesce jobs resume: error: OPENAI_API_KEY is not set")


@pytest.mark.parametrize("command", ["wait", "cancel"])
def test_an_unknown_id_is_a_one_line_error(path: Path, jobs: Run, command: str) -> None:
    planned(path, SimulatedProvider(), "openai")
    assert jobs(command, "zzzzzzzz", "--store", path) == (
        2,
        "",
        f"coalesce jobs {command}: error: no job 'zzzzzzzz' in the job store {path};"
        f" `coalesce jobs list --store {path}` lists them\n",
    )


@pytest.mark.parametrize("command", [["wait", "abcdef"], ["cancel", "abcdef"], ["resume"]])
def test_a_missing_store_is_a_one_line_error_and_is_not_created(
    tmp_path: Path, jobs: Run, command: list[str]
) -> None:
    missing = tmp_path / "nowhere" / "jobs.sqlite3"
    code, out, err = jobs(*command, "--store", missing)
    assert (code, out) == (2, "")
    assert err.startswith(f"coalesce jobs {command[0]}: error: no job store at {missing} ")
    assert err.count("\n") == 1
    assert not missing.parent.exists()


def test_a_file_that_is_not_a_store_is_refused(path: Path, jobs: Run) -> None:
    path.write_bytes(b"not a database" * 100)
    code, _, err = jobs("resume", "--store", path)
    assert code == 2
    assert err.startswith(f"coalesce jobs resume: error: {path} is not a coalesce job store (")
    assert err.count("\n") == 1


@pytest.mark.parametrize(("command", "doing"), [("wait", "wait for"), ("cancel", "cancel")])
def test_a_job_never_submitted_has_no_batch_to_wait_for_or_cancel(
    path: Path, jobs: Run, command: str, doing: str
) -> None:
    job = planned(path, SimulatedProvider(), "anthropic")
    assert jobs(command, job.id, "--store", path) == (
        2,
        "",
        f"coalesce jobs {command}: error: job {job.id} is planned: it was never submitted,"
        f" so there is no batch to {doing}; `coalesce jobs resume` submits it\n",
    )


def test_base_url_for_jobs_of_two_providers_is_refused(path: Path, jobs: Run) -> None:
    sim = SimulatedProvider()
    planned(path, sim, "openai")
    planned(path, sim, "anthropic")
    code, out, err = jobs("resume", "--store", path, "--base-url", "http://x")
    assert (code, out) == (2, "")
    assert err == (
        "coalesce jobs resume: error: --base-url http://x would serve jobs of anthropic and"
        " openai; add --provider to resume one provider's jobs, or set OPENAI_BASE_URL and"
        " ANTHROPIC_BASE_URL instead\n"
    )


def test_check_base_url_allows_one_provider_or_no_override() -> None:
    check_base_url(["openai", "openai"], "http://x")
    check_base_url(["openai", "anthropic"], None)


@pytest.mark.parametrize("poll", ["0", "-1", "nan", "inf", "soon"])
def test_poll_must_be_a_positive_number_of_seconds(jobs: Run, poll: str) -> None:
    with pytest.raises(SystemExit) as info:
        jobs("resume", "--poll", poll)
    assert info.value.code == 2


# --- progress display: pure ------------------------------------------------------------


def test_durations_read_at_a_glance() -> None:
    assert [duration(s) for s in (0, 59.9, 60, 185, 3599, 3600, 7620)] == [
        *("0s", "59s", "1m00s", "3m05s", "59m59s", "1h00m", "2h07m"),
    ]


def test_progress_lines_plain_and_with_a_bar() -> None:
    half = Progress("in_progress", 4, 8, final=False)
    assert progress_line("job abc", half, 65) == "job abc: in_progress, 4/8 lines done, 1m05s"
    assert progress_line("job abc", half, 65, bar=10) == (
        "job abc [#####.....] 4/8 lines  in_progress  1m05s"
    )
    validating = Progress("validating", 0, 0, final=False)
    assert progress_line("j", validating, 0, bar=4) == "j [....] 0/0 lines  validating  0s"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.anyio
async def test_on_a_terminal_the_bar_is_redrawn_in_place_and_ended_with_a_newline() -> None:
    stream = Terminal()
    display = Display(stream, "j")
    display.show(Progress("in_progress", 1, 2, final=False))
    display.show(Progress("done", 2, 2, final=True))
    display.close()
    first, second = stream.getvalue().split("\r")[1:]
    assert first.startswith("j [" + "#" * 15 + "." * 15 + "] 1/2 lines  in_progress  ")
    # The shorter second line is padded over the first, then the line ends.
    assert second.rstrip(" \n").startswith("j [" + "#" * 30 + "] 2/2 lines  done  ")
    assert len(second) == len(first) + 1
    assert second.endswith("\n")


@pytest.mark.anyio
async def test_off_a_terminal_each_poll_is_a_line_of_its_own() -> None:
    stream = io.StringIO()
    display = Display(stream, "j")
    display.show(Progress("validating", 0, 0, final=False))
    display.show(Progress("completed", 2, 2, final=True))
    display.close()
    assert [line.split(",")[:2] for line in stream.getvalue().splitlines()] == [
        ["j: validating", " 0/0 lines done"],
        ["j: completed", " 2/2 lines done"],
    ]


def test_results_are_checked_only_as_json() -> None:
    value = {"label": "positive", "n": [1, 2.5, None]}
    assert json_value(value) is value
    with pytest.raises(ValueError, match="Out of range float"):
        json_value(float("nan"))

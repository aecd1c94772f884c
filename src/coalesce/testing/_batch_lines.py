"""What both batch APIs share: answering lines, storing a batch, the enqueued-token limit.

A batch's lines that will ever be done are answered when it is created (each one
drawing its faults and logged in the ledger as a request); the lines its completion
window or a scripted stall leaves undone are never answered, logged or billed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

from ._accounting import RequestRecord
from ._batch_rules import OverLimit, over_limit, page
from ._batches import Batch, LineResult
from ._cache_store import CacheUse
from ._call import Call, Simulation
from ._engine import Prompt, ReplyContext, prompt_tokens
from ._faults import HTTP_FAULTS, Fault
from ._flavour import Flavour, error_body, fault_error
from ._generate import compose_answer
from ._http import HttpError
from ._tokens import count_text
from ._wire import parse_packed

__all__ = [
    "BatchUsage",
    "answer_line",
    "batch_page",
    "batch_usage",
    "find_batch",
    "jsonl",
    "limit",
    "store_batch",
]


def answer_line(
    sim: Simulation, flavour: Flavour, body: Any, api_key: str, batch_id: str, finish: float
) -> tuple[int, dict[str, Any]]:
    """Answer at once one line of the batch ``batch_id`` (its request ``body``, in
    ``flavour``), which ``api_key`` created; the line is logged as done at ``finish``.
    Returns (status, response body)."""
    if not isinstance(body, dict):
        return 400, error_body(flavour, 400, "the request body must be an object")
    try:
        prompt = flavour.parse({**body, "stream": False})
    except HttpError as exc:
        return exc.status, error_body(flavour, exc.status, exc.message)
    now = sim.clock.now()

    faults = sim.faults.next()
    answer = compose_answer(sim, prompt, faults)
    tokens_in = prompt_tokens(prompt, count_text)
    broken = sorted(faults & (HTTP_FAULTS | {Fault.HANG, Fault.DISCONNECT}))
    status, error = fault_error(flavour, broken[0]) if broken else (200, None)
    faults_seen = {*broken} if broken else answer.faults
    cache = _line_cache(sim, prompt, api_key, tokens_in, finish) if error is None else CacheUse()
    sim.ledger.add(
        RequestRecord(
            api=flavour.api.split(".")[0] + ".batch", model=prompt.model, api_key=api_key,
            items=answer.items, prompt_tokens=tokens_in,
            completion_tokens=answer.completion_tokens if status == 200 else 0, status=status,
            faults=tuple(sorted(f.value for f in faults_seen)), started_at=now,
            finished_at=finish, batch_id=batch_id, cached_tokens=cache.read,
            cache_write_tokens=cache.written, degraded=answer.degraded if status == 200 else 0,
        )
    )  # fmt: skip
    if error is not None:
        return status, error
    ctx = ReplyContext(
        sim.next_id(flavour.id_prefix), int(sim.clock.unix(finish)), tokens_in, prompt, body,
        cached_tokens=cache.read, cache_write_tokens=cache.written,
    )  # fmt: skip
    return 200, flavour.render(answer, ctx)


def _line_cache(
    sim: Simulation, prompt: Prompt, api_key: str, tokens_in: int, finish: float
) -> CacheUse:
    """Read and write the prompt cache as the line is processed: lines run one after
    another, so a line reads what the lines before it wrote."""
    use = sim.prompt_cache.lookup(
        prompt.cache, (api_key, prompt.model), tokens_in, finish, count_text
    )
    sim.prompt_cache.commit(use, finish, finish)
    return use


class BatchUsage(NamedTuple):
    """What a batch's lines carry, counted when it is created.

    Attributes:
        tokens: Prompt tokens per model (what the enqueued-token limit counts).
        items: Packed items, or 1 per plain line (0 for a line that does not parse).
    """

    tokens: dict[str, int]
    items: int


def batch_usage(flavour: Flavour, requests: list[tuple[str, Any]]) -> BatchUsage:
    """Count the tokens and items of a batch's lines (``(custom_id, request body)`` each)."""
    tokens: Counter[str] = Counter()
    items = 0
    for _, body in requests:
        try:
            prompt = flavour.parse({**body, "stream": False}) if isinstance(body, dict) else None
        except HttpError:
            prompt = None
        if prompt is not None:
            tokens[prompt.model] += prompt_tokens(prompt, count_text)
            items += len(parse_packed(prompt.user_parts) or [None])
    return BatchUsage(dict(tokens), items)


def limit(sim: Simulation, provider: str, usage: BatchUsage) -> OverLimit | None:
    """Return why the enqueued-token limit refuses a new batch of ``usage``, or ``None``
    (``provider``: each API counts its own batches)."""
    now = sim.clock.now()
    return over_limit(
        sim.enqueued_token_limit,
        usage.tokens,
        lambda model: sim.batches.enqueued(provider, model, now),
    )


def store_batch(
    call: Call,
    flavour: Flavour,
    prefix: str,
    requests: list[tuple[str, Any]],
    request: dict[str, Any],
    errors: list[dict[str, Any]],
    usage: BatchUsage,
    *,
    validate: bool,
) -> Batch:
    """Answer the lines of a new batch that will be done; its timeline shows them over time.

    Args:
        call: The request that creates the batch.
        prefix: The prefix of the batch id.
        requests: ``(custom_id, request body)`` of each line.
        request: The creating request's body, kept for the batch object.
        errors: Validation errors; a batch with errors fails and runs no line.
        usage: The lines' tokens and items.
        validate: Whether the batch goes through a validation phase first.
    """
    sim = call.sim
    batch_id = sim.unique_id(prefix)
    lines = 0 if errors else len(requests)
    timeline = sim.batches.timeline(sim.clock.now(), lines, validate=validate)
    results = [
        LineResult(custom_id, *answer_line(sim, flavour, params, call.api_key, batch_id, finish))
        for (custom_id, params), finish in zip(requests[:lines], timeline.finishes, strict=True)
        if finish < math.inf
    ]  # fmt: skip
    batch = Batch(
        batch_id, timeline, results, request, errors,
        custom_ids=tuple(custom_id for custom_id, _ in requests),
        tokens={} if errors else usage.tokens, items=usage.items,
    )  # fmt: skip
    sim.batches.batches[batch_id] = batch
    return batch


def find_batch(sim: Simulation, batch_id: str, provider: str) -> Batch:
    """Return ``provider``'s batch with this id.

    Raises:
        HttpError: There is none (404, in that API's words).
    """
    batch = sim.batches.batches.get(batch_id)
    if batch is None:
        raise HttpError(404, f"no batch with id {batch_id!r}")
    if batch.provider != provider:
        what = "message batch" if provider == "anthropic" else "batch"
        raise HttpError(404, f"no {what} with id {batch_id!r}")
    return batch


def batch_page(
    sim: Simulation, provider: str, limit: int, *, after: str | None, before: str | None = None
) -> tuple[Sequence[Batch], bool]:
    """Return one page of ``provider``'s batches, newest first, and whether more follow
    (see :func:`~coalesce.testing._batch_rules.page`)."""
    batches = [b for b in reversed(sim.batches.batches.values()) if b.provider == provider]
    return page(batches, [b.id for b in batches], limit, after=after, before=before)


def jsonl(lines: list[str]) -> bytes:
    """Return JSON lines as a file's bytes."""
    return "".join(line + "\n" for line in lines).encode()

"""The batch APIs' edges on the simulator: expiry with partial results, the
enqueued-token limit, repeated custom ids, metadata, list pages, and counting what
the provider received."""

from __future__ import annotations

import json
import math
from typing import Any

import anthropic
import anyio
import httpx2
import openai
import pytest

from coalesce._exceptions import ConfigurationError
from coalesce.testing import BatchSubmission, BatchTiming, SimulatedProvider
from coalesce.testing._batch_rules import (
    OverLimit,
    check_metadata,
    duplicates,
    invalid_anthropic_ids,
    over_limit,
    page,
    page_size,
)
from coalesce.testing._batches import (
    anthropic_status,
    batch_end,
    lines_done,
    make_timeline,
    openai_status,
)
from coalesce.testing._http import HttpError

pytestmark = pytest.mark.anyio

TIMING = BatchTiming(
    validating=10, per_request=1, finalizing=5, cancelling=2, completion_window=3600
)
MODEL = "gpt-4o-mini"


def chat_line(custom_id: str, text: str, model: str = MODEL) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def message_requests(ids: list[str], model: str = "claude-x") -> Any:
    return [
        {
            "custom_id": custom_id,
            "params": {
                "model": model,
                "max_tokens": 50,
                "messages": [{"role": "user", "content": f"question {custom_id}"}],
            },
        }
        for custom_id in ids
    ]


async def submit(client: openai.AsyncOpenAI, lines: list[dict[str, Any]], **options: Any) -> Any:
    upload = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h", **options
    )


async def read_lines(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in (await client.files.content(file_id)).text.splitlines()]


# ------------------------------------------------------------------------ expiry


async def test_an_openai_batch_expires_with_the_finished_lines_kept() -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.expire_next_batch(after_lines=2)
    sim.inject(None, "server_error")
    async with sim.openai_client(max_retries=0) as client:
        batch = await submit(client, [chat_line(f"r{n}", f"q{n}") for n in range(5)])
        assert batch.expires_at == batch.created_at + 3600
        await anyio.sleep(3599)
        batch = await client.batches.retrieve(batch.id)
        assert (batch.status, batch.expired_at) == ("in_progress", None)
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 1)
        await anyio.sleep(1)
        batch = await client.batches.retrieve(batch.id)
        assert batch.status == "expired"
        assert batch.expired_at == batch.expires_at
        assert (batch.completed_at, batch.finalizing_at) == (None, None)
        assert batch.request_counts is not None
        counts = batch.request_counts
        assert (counts.total, counts.completed, counts.failed) == (5, 1, 4)
        output = await read_lines(client, batch.output_file_id)
        errors = await read_lines(client, batch.error_file_id)
        with pytest.raises(openai.BadRequestError, match="expired"):
            await client.batches.cancel(batch.id)
    assert [line["custom_id"] for line in output] == ["r0"]
    assert output[0]["response"]["status_code"] == 200
    assert [line["custom_id"] for line in errors] == ["r1", "r2", "r3", "r4"]
    assert errors[0]["response"]["status_code"] == 500
    assert {json.dumps(line["error"]) for line in errors[1:]} == {
        json.dumps(
            {
                "code": "batch_expired",
                "message": "This request could not be executed before the completion window expired.",
            }
        )
    }
    assert all(line["response"] is None for line in errors[1:])
    assert [r.batch_id for r in sim.requests] == [batch.id] * 2  # undone lines are not billed


async def test_a_short_completion_window_expires_the_lines_past_it() -> None:
    sim = SimulatedProvider(batches=BatchTiming(validating=1, per_request=1, completion_window=4.5))
    async with sim.openai_client(max_retries=0) as client:
        batch = await submit(client, [chat_line(f"r{n}", "q") for n in range(10)])
        await anyio.sleep(4.5)
        batch = await client.batches.retrieve(batch.id)
        output = await read_lines(client, batch.output_file_id)
    assert batch.status == "expired"
    assert [line["custom_id"] for line in output] == ["r0", "r1", "r2"]  # done at 2, 3, 4 s
    assert len(sim.requests) == 3


async def test_a_batch_that_finishes_in_time_completes() -> None:
    sim = SimulatedProvider(batches=BatchTiming(validating=1, per_request=1, completion_window=4.5))
    async with sim.openai_client(max_retries=0) as client:
        batch = await submit(client, [chat_line(f"r{n}", "q") for n in range(3)])
        await anyio.sleep(3600)
        batch = await client.batches.retrieve(batch.id)
    assert batch.status == "completed"  # lines done at 2, 3, 4 s; finalizing may pass the window
    assert batch.error_file_id is None


async def test_a_cancelled_openai_batch_lists_its_undone_lines_as_cancelled() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.openai_client(max_retries=0) as client:
        batch = await submit(client, [chat_line(f"r{n}", "q") for n in range(5)])
        await anyio.sleep(12.5)  # lines done at 11 and 12 s
        await client.batches.cancel(batch.id)
        await anyio.sleep(2)
        batch = await client.batches.retrieve(batch.id)
        errors = await read_lines(client, batch.error_file_id)
    assert batch.status == "cancelled"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 3)
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        ("r2", "batch_cancelled"),
        ("r3", "batch_cancelled"),
        ("r4", "batch_cancelled"),
    ]


async def test_an_anthropic_batch_expires_with_the_finished_results_kept() -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.expire_next_batch(after_lines=1)
    async with sim.anthropic_client(max_retries=0) as client:
        batch = await client.messages.batches.create(requests=message_requests(["a", "b", "c"]))
        await anyio.sleep(3599)
        batch = await client.messages.batches.retrieve(batch.id)
        assert batch.processing_status == "in_progress"
        assert batch.request_counts.processing == 2
        await anyio.sleep(1)
        batch = await client.messages.batches.retrieve(batch.id)
        results = {
            entry.custom_id: entry.result.type
            async for entry in await client.messages.batches.results(batch.id)
        }
    assert batch.processing_status == "ended"
    assert batch.ended_at == batch.expires_at
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.expired, counts.canceled) == (0, 1, 2, 0)
    assert results == {"a": "succeeded", "b": "expired", "c": "expired"}
    assert len(sim.requests) == 1


async def test_scripted_expiries_queue_up_and_skip_failed_batches() -> None:
    sim = SimulatedProvider(batches=TIMING)
    sim.expire_next_batch(after_lines=0)
    sim.expire_next_batch(after_lines=1)
    async with sim.openai_client(max_retries=0) as client:
        bad = await client.files.create(file=("bad.jsonl", b"not json\n"), purpose="batch")
        await client.batches.create(
            input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        first = await submit(client, [chat_line("a", "q"), chat_line("b", "q")])
        second = await submit(client, [chat_line("c", "q"), chat_line("d", "q")])
        third = await submit(client, [chat_line("e", "q")])
        await anyio.sleep(3600)
        done = [await client.batches.retrieve(b.id) for b in (first, second, third)]
    assert [b.status for b in done] == ["expired", "expired", "completed"]
    assert [b.request_counts.completed for b in done if b.request_counts] == [0, 1, 1]
    assert done[0].output_file_id is None
    with pytest.raises(ConfigurationError, match="after_lines"):
        sim.expire_next_batch(after_lines=-1)


# --------------------------------------------------------- the enqueued-token limit


async def batch_tokens(lines: list[dict[str, Any]]) -> int:
    """The prompt tokens the simulator counts for these lines."""
    probe = SimulatedProvider(batches=TIMING)
    async with probe.openai_client(max_retries=0) as client:
        await submit(client, lines)
    return sum(r.prompt_tokens for r in probe.requests)


async def test_an_openai_create_over_the_enqueued_token_limit_fails() -> None:
    lines = [chat_line(f"r{n}", f"question {n}") for n in range(3)]
    tokens = await batch_tokens(lines)
    sim = SimulatedProvider(batches=TIMING, enqueued_token_limit={MODEL: tokens * 3 // 2})
    async with sim.openai_client(max_retries=0) as client:
        first = await submit(client, lines)
        refused = await submit(client, lines)
        other_model = await submit(client, [chat_line("x", "q", model="gpt-4o")])
        await anyio.sleep(10)
        refused = await client.batches.retrieve(refused.id)
        assert (await client.batches.retrieve(other_model.id)).status == "in_progress"
        await anyio.sleep(8)  # the first batch completes at 10 + 3 + 5 s
        assert (await client.batches.retrieve(first.id)).status == "completed"
        again = await submit(client, lines)
        await anyio.sleep(10)
        again = await client.batches.retrieve(again.id)
    assert refused.status == "failed"
    assert refused.errors is not None
    assert refused.errors.data is not None
    (error,) = refused.errors.data
    assert (error.code, error.line, error.param) == ("token_limit_exceeded", None, None)
    assert error.message is not None
    assert error.message.startswith(f"Enqueued token limit reached for {MODEL} in organization")
    assert f"Limit: {tokens * 3 // 2:,} enqueued tokens" in error.message
    assert refused.request_counts is not None
    assert refused.request_counts.total == 0
    assert again.status == "in_progress"
    assert [s.failed for s in sim.batch_submissions] == [False, True, False, False]


async def test_a_failed_batch_holds_no_tokens() -> None:
    lines = [chat_line("r", "question")]
    tokens = await batch_tokens(lines)
    sim = SimulatedProvider(batches=TIMING, enqueued_token_limit=tokens)
    async with sim.openai_client(max_retries=0) as client:
        await submit(client, [*lines, chat_line("r", "again")])  # a repeated id: failed
        accepted = await submit(client, lines)
        await anyio.sleep(10.5)
        accepted = await client.batches.retrieve(accepted.id)
    assert accepted.status == "in_progress"


async def test_an_anthropic_create_over_the_enqueued_token_limit_is_a_429() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.anthropic_client(max_retries=0) as client:
        await client.messages.batches.create(requests=message_requests(["a", "b"]))
    tokens = sum(r.prompt_tokens for r in sim.requests)
    sim = SimulatedProvider(batches=TIMING, enqueued_token_limit=tokens)
    async with sim.anthropic_client(max_retries=0) as client:
        first = await client.messages.batches.create(requests=message_requests(["a", "b"]))
        with pytest.raises(
            anthropic.RateLimitError, match="enqueued tokens for claude-x"
        ) as caught:
            await client.messages.batches.create(requests=message_requests(["c"]))
        await anyio.sleep(7)  # lines done at 1 and 2 s, then 5 s to the end
        assert (await client.messages.batches.retrieve(first.id)).processing_status == "ended"
        await client.messages.batches.create(requests=message_requests(["c"]))
    assert caught.value.status_code == 429
    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert [s.custom_ids for s in sim.batch_submissions] == [("a", "b"), ("c",)]


def test_the_limit_is_configured_like_a_context_window() -> None:
    sim = SimulatedProvider.from_config({"enqueued_token_limit": {"gpt-4o": 90000}})
    assert sim.enqueued_token_limit == {"gpt-4o": 90000}
    with pytest.raises(ConfigurationError, match="enqueued_token_limit must be a positive"):
        SimulatedProvider(enqueued_token_limit=0)
    with pytest.raises(ConfigurationError, match="completion_window"):
        BatchTiming(completion_window=0)


# ------------------------------------------------------- custom ids and metadata


async def test_repeated_custom_ids_fail_the_openai_batch() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.openai_client(max_retries=0) as client:
        batch = await submit(
            client, [chat_line("a", "q"), chat_line("b", "q"), chat_line("a", "q")]
        )
        await anyio.sleep(10)
        batch = await client.batches.retrieve(batch.id)
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [("duplicate_custom_id", 3)]
    assert sim.requests == ()


async def test_anthropic_refuses_repeated_or_malformed_custom_ids() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.anthropic_client(max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError, match="'a' is used twice"):
            await client.messages.batches.create(requests=message_requests(["a", "b", "a"]))
        with pytest.raises(anthropic.BadRequestError, match="1 to 64 characters"):
            await client.messages.batches.create(requests=message_requests(["job:1"]))
    assert sim.batch_submissions == ()


async def test_openai_metadata_is_kept_and_checked() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.openai_client(max_retries=0) as client:
        batch = await submit(client, [chat_line("a", "q")], metadata={"job": "j1", "chunk": "0"})
        assert batch.metadata == {"job": "j1", "chunk": "0"}
        assert (await client.batches.retrieve(batch.id)).metadata == {"job": "j1", "chunk": "0"}
        listed = await client.batches.list()
        assert [b.metadata for b in listed.data] == [{"job": "j1", "chunk": "0"}]
        too_many = {f"k{n}": "v" for n in range(17)}
        with pytest.raises(openai.BadRequestError, match="at most 16 pairs"):
            await submit(client, [chat_line("a", "q")], metadata=too_many)
        with pytest.raises(openai.BadRequestError, match="at most 512 characters"):
            await submit(client, [chat_line("a", "q")], metadata={"k": "v" * 513})


# ------------------------------------------------------------------- list pages


async def test_openai_lists_batches_newest_first_twenty_a_page() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.openai_client(max_retries=0) as client:
        created = [(await submit(client, [chat_line("a", "q")])).id for _ in range(25)]
        first = await client.batches.list()
        every = [b.id async for b in client.batches.list(limit=7)]
        with pytest.raises(openai.BadRequestError, match="limit"):
            await client.batches.list(limit=101)
        with pytest.raises(openai.BadRequestError, match="cursor"):
            await client.batches.list(after="batch_nope")
    assert [b.id for b in first.data] == created[::-1][:20]
    assert first.has_more
    assert every == created[::-1]


async def test_anthropic_lists_message_batches_with_both_cursors() -> None:
    sim = SimulatedProvider(batches=TIMING)
    async with sim.anthropic_client(max_retries=0) as client:
        created = [
            (await client.messages.batches.create(requests=message_requests([f"r{n}"]))).id
            for n in range(5)
        ]
        every = [b.id async for b in client.messages.batches.list(limit=2)]
        newest = await client.messages.batches.list(limit=2)
        older = await client.messages.batches.list(limit=2, after_id=created[3])
        newer = await client.messages.batches.list(limit=2, before_id=created[1])
        openai_side = await sim.openai_client(max_retries=0).batches.list()
    assert every == created[::-1]
    assert ([b.id for b in newest.data], newest.has_more) == (created[:2:-1], True)
    assert newest.first_id == created[4]
    assert newest.last_id == created[3]
    assert ([b.id for b in older.data], older.has_more) == ([created[2], created[1]], True)
    assert ([b.id for b in newer.data], newer.has_more) == ([created[3], created[2]], True)
    assert openai_side.data == []


# ------------------------------------------------------------ what was submitted


async def test_every_created_batch_is_counted_with_its_lines() -> None:
    sim = SimulatedProvider(batches=TIMING)
    packed = json.dumps([{"id": "1", "input": "x"}, {"id": "2", "input": "y"}])
    async with sim.openai_client(max_retries=0) as client:
        batch = await submit(
            client, [chat_line("p0", packed), chat_line("p1", "plain")], metadata={"job": "j"}
        )
    async with sim.anthropic_client(max_retries=0) as claude:
        message_batch = await claude.messages.batches.create(requests=message_requests(["m0"]))
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=sim), base_url="http://sim"
    ) as http:
        stats = (await http.get("/_sim/stats")).json()
        assert (await http.post("/_sim/batches/expire", json={"after_lines": 1})).json() == {
            "after_lines": 1
        }
        assert (
            await http.post("/_sim/batches/expire", json={"after_lines": -1})
        ).status_code == 400
    openai_side, anthropic_side = sim.batch_submissions
    assert openai_side == BatchSubmission(
        provider="openai",
        batch_id=batch.id,
        created_at=openai_side.created_at,
        input_file_id=batch.input_file_id,
        custom_ids=("p0", "p1"),
        items=3,
        metadata={"job": "j"},
        failed=False,
    )
    assert (anthropic_side.provider, anthropic_side.batch_id) == ("anthropic", message_batch.id)
    assert (anthropic_side.custom_ids, anthropic_side.items) == (("m0",), 1)
    assert (anthropic_side.input_file_id, anthropic_side.metadata) == (None, None)
    assert stats["batches"] == [openai_side.as_dict(), anthropic_side.as_dict()]
    assert stats["batches"][0]["custom_ids"] == ["p0", "p1"]
    sim.reset()
    assert sim.batch_submissions == ()


# ----------------------------------------------------------- the pure decisions


def test_a_timeline_never_finishes_the_lines_past_its_window_or_stall() -> None:
    timing = BatchTiming(validating=1, per_request=1, finalizing=1, completion_window=3.5)
    line = make_timeline(0.0, 4, timing, 1.0, validate=True)
    assert line.finishes == (2.0, 3.0, math.inf, math.inf)
    assert (line.finalizing, line.completed, line.expires) == (math.inf, math.inf, 3.5)
    assert lines_done(line, math.inf) == 2
    assert batch_end(line, None, 1.0, failed=False) == 3.5
    assert openai_status(line, None, 1.0, False, 3.4) == "in_progress"
    assert openai_status(line, None, 1.0, False, 3.5) == "expired"
    assert anthropic_status(line, None, 1.0, 3.5) == "ended"
    stalled = make_timeline(
        0.0, 4, BatchTiming(validating=0, per_request=0), 1.0, validate=False, stall_after=1
    )
    assert stalled.finishes == (0.0, math.inf, math.inf, math.inf)
    whole = make_timeline(0.0, 2, timing, 2.0, validate=True, stall_after=5)
    assert whole.finishes == (4.0, 6.0)  # the window scales too: 7 s
    assert batch_end(whole, None, 1.0, failed=False) == whole.completed == 8.0


def test_over_limit_names_the_first_model_over_it() -> None:
    enqueued = {"a": 50, "b": 0}.get
    assert over_limit(None, {"a": 10**9}, lambda m: 0) is None
    assert over_limit(100, {"a": 50, "b": 100}, lambda m: enqueued(m) or 0) is None
    assert over_limit(100, {"a": 51}, lambda m: enqueued(m) or 0) == OverLimit("a", 50, 51, 100)
    assert over_limit({"b": 10}, {"a": 500, "b": 11}, lambda m: 0) == OverLimit("b", 0, 11, 10)


def test_duplicates_and_anthropic_ids() -> None:
    assert duplicates(["a", "b", "a", "a", "c"]) == [2, 3]
    assert duplicates([]) == []
    assert invalid_anthropic_ids(["ok_1-2", "x" * 64, "x" * 65, "", "a:b"]) == ["x" * 65, "", "a:b"]


def test_metadata_rules() -> None:
    assert check_metadata(None) is None
    assert check_metadata({"k" * 64: "v" * 512}) is None
    assert check_metadata(["k"]) is not None
    assert check_metadata({"k" * 65: "v"}) is not None
    assert check_metadata({"k": 1}) is not None


def test_pages_go_both_ways() -> None:
    items = list("edcba")
    assert page(items, items, 2) == (["e", "d"], True)
    assert page(items, items, 5) == (items, False)
    assert page(items, items, 2, after="d") == (["c", "b"], True)
    assert page(items, items, 2, after="b") == (["a"], False)
    assert page(items, items, 2, before="c") == (["e", "d"], False)
    assert page(items, items, 1, before="c") == (["d"], True)
    assert page_size({}, 100) == 20
    assert page_size({"limit": "100"}, 100) == 100
    for bad in ("0", "101", "x", "-1"):
        with pytest.raises(HttpError, match="limit"):
            page_size({"limit": bad}, 100)

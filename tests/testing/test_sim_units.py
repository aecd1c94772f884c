"""Pure decisions of the simulator: latency, rate limits, faults, wire, batches, config."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import coalesce.testing
from coalesce._exceptions import ConfigurationError
from coalesce._wire.schema import build_reply_schema
from coalesce.testing import (
    BatchTiming,
    Fault,
    FaultPlan,
    LatencyProfile,
    RateLimit,
    RateLimits,
    SimulatedLatency,
    SimulatedProvider,
    compute_delays,
)
from coalesce.testing._anthropic import ANTHROPIC
from coalesce.testing._batches import anthropic_status, lines_done, make_timeline, openai_status
from coalesce.testing._engine import Prompt, compose, cut_to_tokens, split_pieces
from coalesce.testing._faults import (
    FAULT_STATUS,
    HTTP_FAULTS,
    FaultSource,
    choose_fault,
    damage_results,
    damage_text,
)
from coalesce.testing._flavour import fault_error
from coalesce.testing._latency import pace
from coalesce.testing._openai import OPENAI
from coalesce.testing._ratelimit import (
    Bucket,
    RateLimiter,
    anthropic_headers,
    go_duration,
    openai_headers,
    refill,
    retry_headers,
    seconds_until,
)
from coalesce.testing._tokens import count_text
from coalesce.testing._wire import parse_packed


def test_exports_are_sorted_and_complete() -> None:
    names = coalesce.testing.__all__
    assert names == sorted(names)
    public = {n for n in dir(coalesce.testing) if not n.startswith("_")} - {
        "annotations",
        "pytest_plugin",
    }
    assert public == set(names)


def test_importing_the_package_imports_no_sdk_and_no_server() -> None:
    import subprocess
    import sys

    code = "import sys, coalesce.testing; print(sorted(m for m in ('uvicorn', 'openai', 'anthropic', 'httpx2', 'pytest') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -------------------------------------------------------------------- latency


def test_compute_delays() -> None:
    profile = LatencyProfile(ttft=0.5, prompt_token_seconds=0.001, tokens_per_second=50)
    delays = compute_delays(profile, 1000, 100)
    assert delays == (1.5, 2.0)
    assert delays.total == 3.5
    assert compute_delays(profile, 1000, 100, time_scale=0.01) == pytest.approx((0.015, 0.02))
    assert compute_delays(profile, 0, 0, jitter=0.2, noise=0.0).first_token == pytest.approx(0.4)
    assert compute_delays(profile, 0, 0, jitter=0.2, noise=1.0).first_token == pytest.approx(0.6)


def test_profiles_by_model_name() -> None:
    fast, slow = LatencyProfile(ttft=0.1), LatencyProfile(ttft=2.0)
    model = SimulatedLatency(
        default=slow, models={"gpt-4o": fast, "gpt-4o-mini": LatencyProfile(ttft=0.2)}
    )
    assert model.profile_for("gpt-4o") is fast
    assert model.profile_for("gpt-4o-2024-08-06") is fast
    assert model.profile_for("gpt-4o-mini-2024") == LatencyProfile(ttft=0.2)
    assert model.profile_for("anything") is slow


def test_latency_validation() -> None:
    with pytest.raises(ConfigurationError, match="tokens_per_second"):
        LatencyProfile(tokens_per_second=0)
    with pytest.raises(ConfigurationError, match="ttft"):
        LatencyProfile(ttft=-1)
    with pytest.raises(ConfigurationError, match="jitter"):
        SimulatedLatency(jitter=1.5)


def test_latency_model_is_the_former_name_of_simulated_latency() -> None:
    assert coalesce.testing.LatencyModel is SimulatedLatency


def test_pace() -> None:
    assert pace(2.0, [0, 1, 3]) == [0.0, 0.5, 1.5]
    assert pace(2.0, [0, 0]) == [0.0, 0.0]


# ------------------------------------------------------------------ rate limits


def test_bucket_arithmetic() -> None:
    assert refill(Bucket(0.0, 0.0), 60, 60.0, 30.0) == Bucket(30.0, 30.0)
    assert refill(Bucket(50.0, 0.0), 60, 60.0, 30.0) == Bucket(60.0, 30.0)
    assert seconds_until(Bucket(0.0, 0.0), 60, 60.0, 10) == 10.0
    assert seconds_until(Bucket(20.0, 0.0), 60, 60.0, 10) == 0.0
    assert seconds_until(Bucket(60.0, 0.0), 60, 60.0, 61) == float("inf")


def test_rate_limiter_per_key() -> None:
    limits = RateLimits(
        default=RateLimit(requests_per_minute=2), keys={"vip": RateLimit(tokens_per_minute=100)}
    )
    limiter = RateLimiter(limits, 60.0)
    assert limiter.check("a", 10, 0.0).allowed
    second = limiter.check("a", 10, 0.0)
    assert second.allowed
    assert second.requests == (2, 0, 60.0)
    third = limiter.check("a", 10, 0.0)
    assert not third.allowed
    assert third.retry_after == 30.0
    assert limiter.check("b", 10, 0.0).allowed  # keys are separate
    assert limiter.check("a", 10, 30.0).allowed  # one request refilled after 30 s
    assert limiter.check("vip", 60, 0.0).allowed
    refused = limiter.check("vip", 60, 0.0)
    assert not refused.allowed
    assert refused.retry_after == pytest.approx(12.0)
    assert refused.tokens.remaining == 40
    limiter.reset()
    assert limiter.check("vip", 60, 0.0).allowed


def test_rate_limit_headers() -> None:
    limiter = RateLimiter(RateLimits(default=RateLimit(5, 1000)), 60.0)
    decision = limiter.check("k", 100, 0.0)
    assert openai_headers(decision) == {
        "x-ratelimit-limit-requests": "5",
        "x-ratelimit-remaining-requests": "4",
        "x-ratelimit-reset-requests": "12s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "6s",
    }
    headers = anthropic_headers(decision, 1_700_000_000.0)
    assert headers["anthropic-ratelimit-requests-limit"] == "5"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "900"
    assert headers["anthropic-ratelimit-tokens-reset"] == "2023-11-14T22:13:26Z"
    assert openai_headers(RateLimiter(RateLimits(), 60.0).check("k", 1, 0.0)) == {}
    assert go_duration(0.02) == "20ms"
    assert go_duration(1.5) == "1.5s"
    assert go_duration(360) == "6m0s"
    assert retry_headers(0.0123) == {"retry-after": "1", "retry-after-ms": "13"}
    assert retry_headers(float("inf"))["retry-after"] == "60"


def test_rate_limit_validation() -> None:
    with pytest.raises(ConfigurationError, match="requests_per_minute"):
        RateLimit(requests_per_minute=0)


# ----------------------------------------------------------------------- faults


def test_choose_fault() -> None:
    chances = {Fault.SERVER_ERROR: 0.25, Fault.PROSE: 0.25}
    assert choose_fault(chances, 0.1) is Fault.SERVER_ERROR
    assert choose_fault(chances, 0.3) is Fault.PROSE
    assert choose_fault(chances, 0.6) is None


def test_fault_source_script_then_draws() -> None:
    plan = FaultPlan(
        probabilities={"server_error": 0.5},
        script=[None, "hang", ["prose", Fault.TRUNCATE]],
        seed=3,
    )
    source = FaultSource(plan)
    assert source.next() == frozenset()
    assert source.next() == {Fault.HANG}
    assert source.next() == {Fault.PROSE, Fault.TRUNCATE}
    draws = [source.next() for _ in range(200)]
    assert 70 < sum(bool(d) for d in draws) < 130
    again = FaultSource(plan)
    assert [again.next() for _ in range(203)][3:] == draws
    source.inject("missing_item")
    assert source.pending == 1
    assert source.next() == {Fault.MISSING_ITEM}


def test_fault_errors_per_flavour() -> None:
    assert fault_error(OPENAI, Fault.RATE_LIMIT) == (
        429,
        {
            "error": {
                "message": "simulated fault: rate_limit",
                "type": "rate_limit_error",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        },
    )
    assert fault_error(ANTHROPIC, Fault.UNAVAILABLE) == (
        503,
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "simulated fault: unavailable"},
        },
    )
    # A batch line that hangs or drops has no status of its own: it fails with 500.
    assert fault_error(OPENAI, Fault.HANG)[0] == 500
    assert set(FAULT_STATUS) == HTTP_FAULTS


def test_fault_plan_validation() -> None:
    with pytest.raises(ConfigurationError, match="add up"):
        FaultPlan(probabilities={"prose": 0.7, "hang": 0.7})
    with pytest.raises(ConfigurationError, match="unknown fault 'nope'"):
        FaultPlan(script=["nope"])


RESULTS = [{"id": str(i), "output": f"o{i}"} for i in range(1, 6)]


def test_item_faults() -> None:
    rng = random.Random(0)
    missing, applied = damage_results(RESULTS, frozenset({Fault.MISSING_ITEM}), rng)
    assert len(missing) == 4
    assert applied == {Fault.MISSING_ITEM}
    extra, _ = damage_results(RESULTS, frozenset({Fault.EXTRA_ID}), rng)
    assert len(extra) == 6
    assert {r["id"] for r in extra} - {r["id"] for r in RESULTS} == {
        next(r["id"] for r in extra if r not in RESULTS)
    }
    twice, _ = damage_results(RESULTS, frozenset({Fault.DUPLICATE_ID}), rng)
    ids = [r["id"] for r in twice]
    (dup,) = {i for i in ids if ids.count(i) == 2}
    first, second = (r["output"] for r in twice if r["id"] == dup)
    assert first != second
    shuffled, _ = damage_results(RESULTS, frozenset({Fault.OUT_OF_ORDER}), rng)
    assert shuffled != RESULTS
    assert sorted(shuffled, key=lambda r: r["id"]) == RESULTS
    single, applied = damage_results(RESULTS[:1], frozenset({Fault.OUT_OF_ORDER}), rng)
    assert single == RESULTS[:1]
    assert applied == frozenset()


def test_text_faults() -> None:
    text = json.dumps({"results": RESULTS})
    broken, applied = damage_text(text, frozenset({Fault.MALFORMED_JSON}))
    assert applied == {Fault.MALFORMED_JSON}
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    fenced, _ = damage_text(text, frozenset({Fault.CODE_FENCE}))
    assert fenced.startswith("```json\n")
    assert fenced.endswith("\n```")
    prose, _ = damage_text(text, frozenset({Fault.PROSE}))
    assert text in prose
    assert not prose.startswith("{")
    assert damage_text(text, frozenset({Fault.HANG})) == (text, frozenset())


# ------------------------------------------------------------------- wire, engine


def test_parse_packed() -> None:
    items = [{"id": "1", "input": {"a": 1}}, {"id": "2", "input": "x"}]
    parsed = parse_packed([json.dumps(items)])
    assert parsed is not None
    assert [(p.id, p.input) for p in parsed] == [("1", {"a": 1}), ("2", "x")]
    assert parse_packed(["Items:\n" + json.dumps(items)]) is not None
    assert parse_packed(["hello"]) is None
    assert parse_packed(["[]"]) is None
    assert parse_packed([json.dumps([{"id": "1", "input": 1, "x": 2}])]) is None
    assert parse_packed([json.dumps([{"id": 1, "input": 1}])]) is None
    assert parse_packed(["[1, 2]"]) is None


def _prompt(user: str, **options: object) -> Prompt:
    return Prompt(model="m", texts=(user,), user_parts=(user,), **options)  # type: ignore[arg-type]


def test_compose_packed_and_single() -> None:
    items = [{"id": "a", "input": 1}, {"id": "b", "input": 2}]
    answer = compose(
        _prompt(json.dumps(items)),
        frozenset(),
        lengths=None,
        rng=random.Random(0),
        count=count_text,
    )
    outputs = [coalesce.testing.expected_output(1), coalesce.testing.expected_output(2)]
    assert json.loads(answer.text) == {"results": {"a": outputs[0], "b": outputs[1]}}
    assert answer.items == 2
    # Instructions that show format 1 get format 1.
    shown = '{"results": [{"id": <id>, "output": <output>}, ...]}'
    old = compose(
        Prompt(model="m", texts=(shown, json.dumps(items)), user_parts=(json.dumps(items),)),
        frozenset(),
        lengths=None,
        rng=random.Random(0),
        count=count_text,
    )
    assert json.loads(old.text) == {
        "results": [{"id": "a", "output": outputs[0]}, {"id": "b", "output": outputs[1]}]
    }
    assert not answer.truncated
    assert answer.completion_tokens == count_text(answer.text)
    single = compose(
        _prompt("hi"), frozenset(), lengths=None, rng=random.Random(0), count=count_text
    )
    assert single.text == coalesce.testing.expected_output("hi")
    assert single.items == 1
    as_json = compose(
        _prompt("hi", json_mode=True),
        frozenset(),
        lengths=None,
        rng=random.Random(0),
        count=count_text,
    )
    assert json.loads(as_json.text) == {"output": single.text}
    shaped = compose(
        _prompt("hi", schema={"enum": ["x"]}),
        frozenset(),
        lengths=None,
        rng=random.Random(0),
        count=count_text,
    )
    assert shaped.text == '"x"'


def test_compose_keyed_reply_really_repeats_a_duplicated_id() -> None:
    items = [{"id": str(i), "input": i} for i in range(1, 5)]
    answer = compose(
        _prompt(json.dumps(items), schema=build_reply_schema({"type": "string"}, ["1", "2"])),
        frozenset({Fault.DUPLICATE_ID}),
        lengths=None,
        rng=random.Random(0),
        count=count_text,
    )
    assert answer.faults == {Fault.DUPLICATE_ID}
    pairs = json.loads(answer.text, object_pairs_hook=list)[0][1]
    ids = [key for key, _ in pairs]
    assert len(ids) == 5
    assert sorted(set(ids)) == ["1", "2", "3", "4"]
    assert answer.text.startswith('{"results":{"1":')  # compact under a schema


def test_compose_truncates_at_max_tokens() -> None:
    items = [{"id": str(i), "input": i} for i in range(10)]
    answer = compose(
        _prompt(json.dumps(items), max_tokens=30),
        frozenset(),
        lengths=None,
        rng=random.Random(0),
        count=count_text,
    )
    assert answer.truncated
    assert answer.completion_tokens <= 30
    tool = compose(
        _prompt(json.dumps(items), max_tokens=60, tool="t"),
        frozenset(),
        lengths=None,
        rng=random.Random(0),
        count=count_text,
    )
    assert tool.tool_input is not None
    kept = tool.tool_input["results"]
    assert 0 < len(kept) < 10
    assert list(kept) == [str(i) for i in range(len(kept))]  # the first ones, in full
    assert json.dumps(kept)[:-1] in tool.text


def test_compose_text_fault_turns_a_tool_answer_into_text() -> None:
    answer = compose(
        _prompt("q", tool="t"),
        frozenset({Fault.CODE_FENCE}),
        lengths=None,
        rng=random.Random(0),
        count=count_text,
    )
    assert answer.tool_input is None
    assert answer.text.startswith("```json")
    assert answer.faults == {Fault.CODE_FENCE}


def test_cut_and_split() -> None:
    text = "one two three four five six seven"
    assert count_text(cut_to_tokens(text, 3, count_text)) <= 3
    assert "".join(split_pieces(text, max_pieces=3)) == text
    assert len(split_pieces(text, max_pieces=3, min_words=1)) == 3
    assert split_pieces(text, max_pieces=64) == ["one two three four", " five six seven"]
    # Compact JSON has no spaces but still streams in pieces.
    compact = '{"results":[{"id":"0","output":"a"}]}'
    pieces = split_pieces(compact, min_words=2)
    assert "".join(pieces) == compact
    assert pieces[:3] == ['{"', 'results"', ":["]
    assert split_pieces("") == []


# ---------------------------------------------------------------------- batches


def test_openai_batch_timeline() -> None:
    line = make_timeline(
        100.0,
        3,
        BatchTiming(validating=2, per_request=1, finalizing=5, cancelling=1),
        1.0,
        validate=True,
    )
    assert line.finishes == (103.0, 104.0, 105.0)
    statuses = [openai_status(line, None, 1.0, False, t) for t in (100, 102, 104.5, 106, 110)]
    assert statuses == ["validating", "in_progress", "in_progress", "finalizing", "completed"]
    assert openai_status(line, 103.5, 1.0, False, 104) == "cancelling"
    assert openai_status(line, 103.5, 1.0, False, 104.5) == "cancelled"
    assert openai_status(line, None, 1.0, True, 103) == "failed"
    assert lines_done(line, 104.0) == 2


def test_anthropic_batch_timeline() -> None:
    line = make_timeline(0.0, 2, BatchTiming(per_request=1, finalizing=1), 2.0, validate=False)
    assert line.completed == 6.0
    assert [anthropic_status(line, None, 2.0, t) for t in (0, 5.9, 6)] == [
        "in_progress",
        "in_progress",
        "ended",
    ]
    assert anthropic_status(line, 1.0, 2.0, 2.0) == "canceling"
    assert anthropic_status(line, 1.0, 2.0, 3.0) == "ended"


# ----------------------------------------------------------------------- config


def test_config_file(tmp_path: Path) -> None:
    config = {
        "time_scale": 0.5,
        "seed": 7,
        "latency": {
            "default": {"ttft": 1.0},
            "models": {"m": {"tokens_per_second": 10}},
            "jitter": 0.1,
        },
        "rate_limits": {"requests_per_minute": 10, "keys": {"k": {"tokens_per_minute": 5}}},
        "faults": {"probabilities": {"prose": 0.1}, "script": [None, "hang"], "seed": 2},
        "output_tokens": {"long_tail": {"median": 20}},
        "batches": {"validating": 0},
    }
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(config))
    sim = SimulatedProvider.from_file(path)
    assert sim.time_scale == 0.5
    assert sim.seed == 7
    assert sim.latency.profile_for("m").tokens_per_second == 10
    assert sim.rate_limits.keys["k"].tokens_per_minute == 5
    assert sim.fault_plan.script == [None, "hang"]
    assert sim.output_tokens == coalesce.testing.LongTail(median=20)
    assert sim.batch_timing.validating == 0
    toml = tmp_path / "sim.toml"
    toml.write_text("time_scale = 0.25\n[rate_limits]\nrequests_per_minute = 3\n")
    assert SimulatedProvider.from_file(toml).rate_limits.default.requests_per_minute == 3


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"nope": 1}, "unknown simulator configuration keys"),
        ({"latency": {"default": {"speed": 1}}}, "latency.default"),
        ({"output_tokens": "long"}, "output_tokens"),
        ({"faults": {"script": ["boom"]}}, "unknown fault"),
        ({"time_scale": 0}, "time_scale"),
    ],
)
def test_config_errors(config: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SimulatedProvider.from_config(config)


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        SimulatedProvider.from_file(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ConfigurationError, match="must hold an object"):
        SimulatedProvider.from_file(tmp_path / "list.json")

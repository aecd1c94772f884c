"""The planner: pure group sizing against latency budgets, rate-limit decisions.

Hand-built items, limits and quotas; no event loop, no clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coalesce._batching.policy import DispatchReason
from coalesce._exceptions import ConfigurationError
from coalesce._planning.latency import LatencyModel, LatencyPrior
from coalesce._planning.planner import (
    Admission,
    Due,
    Pace,
    PlanItem,
    PlanLimits,
    Predict,
    admit,
    allow_reask,
    binding_limit,
    due,
    due_at,
    full_after_add,
    group_tokens,
    latest_start,
    pack_more,
    streaming_order,
)
from coalesce.providers._ratelimit import (
    Quota,
    RateLimitState,
    parse_go_duration,
    parse_rate_limit_headers,
)
from coalesce.testing._ratelimit import Quota as SimQuota
from coalesce.testing._ratelimit import RateDecision, anthropic_headers, go_duration


def linear(overhead: float = 0.5, prefill: float = 1e-4, decode: float = 0.02) -> Predict:
    """A predictor like the default prior (no margin): easy numbers by hand."""
    return lambda i, o: overhead + prefill * i + decode * o


PREDICT = linear()
# Wrappers of 10 tokens on each side keep the arithmetic below easy to follow.
FRAMES = {"per_item_overhead_tokens": 10, "per_item_output_overhead_tokens": 10}
LIMITS = PlanLimits(max_items=8, max_wait=1.0, shared_tokens=100, **FRAMES)


def item(
    inp: int = 50, out: int = 40, deadline: float = math.inf, arrival: float = 0.0
) -> PlanItem:
    return PlanItem(inp, out, deadline, arrival)


# -- limits and tokens ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_items": 0},
        {"max_wait": -1.0},
        {"max_wait": math.nan},
        {"shared_tokens": -1},
        {"per_item_overhead_tokens": -1},
        {"context_window": 0},
        {"max_output_tokens": 0},
    ],
)
def test_invalid_limits_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        PlanLimits(**kwargs)  # type: ignore[arg-type]


def test_group_tokens_pay_shared_once_and_the_wrapper_per_item_on_both_sides() -> None:
    assert group_tokens([], LIMITS) == (100, 0)
    assert group_tokens([item(50, 40), item(30, 5)], LIMITS) == (100 + 80 + 20, 45 + 20)
    # The two sides' wrappers differ (format 2: ~20 tokens in, ~3 out).
    framed = PlanLimits(shared_tokens=100)
    assert group_tokens([item(50, 40), item(30, 5)], framed) == (100 + 80 + 40, 45 + 6)


# -- admit ----------------------------------------------------------------------------


def test_an_item_that_cannot_meet_its_budget_alone_goes_solo_and_leaves_the_window() -> None:
    # Alone: 0.5 + 1e-4 * 160 + 0.02 * 50 = 1.516 s.
    window = [item(deadline=100.0)]
    assert admit(window, item(deadline=11.5), LIMITS, PREDICT, now=10.0) == Admission(None, True)
    assert admit([], item(deadline=11.5), LIMITS, PREDICT, now=10.0) == Admission(None, True)
    assert admit([], item(deadline=11.6), LIMITS, PREDICT, now=10.0) == Admission(None, False)


def test_an_empty_window_takes_any_item_that_meets_its_budget() -> None:
    tight = PlanLimits(max_items=1, context_window=10, max_output_tokens=1)
    assert admit([], item(), tight, PREDICT, now=0.0) == Admission(None, False)


def test_the_window_goes_first_when_the_group_would_miss_its_most_urgent_deadline() -> None:
    # Two items: 0.5 + 1e-4 * 220 + 0.02 * 100 = 2.522 s; one alone: 1.516 s.
    window = [item(deadline=12.0)]
    decision = admit(window, item(deadline=100.0), LIMITS, PREDICT, now=10.0)
    assert decision == Admission(DispatchReason.DEADLINE, False)
    assert admit(window, item(deadline=100.0), LIMITS, PREDICT, now=9.4) == Admission(None, False)


def test_the_new_items_own_deadline_counts_too() -> None:
    window = [item(deadline=100.0)]
    decision = admit(window, item(deadline=12.0), LIMITS, PREDICT, now=10.0)
    assert decision == Admission(DispatchReason.DEADLINE, False)


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        (PlanLimits(max_items=2, **FRAMES), DispatchReason.FULL),
        # Two items: 120 input + 100 output (wrappers included, no shared tokens).
        (PlanLimits(context_window=219, **FRAMES), DispatchReason.TOKENS),
        (PlanLimits(max_output_tokens=99, **FRAMES), DispatchReason.TOKENS),
        (PlanLimits(context_window=220, max_output_tokens=100, **FRAMES), None),
    ],
)
def test_the_window_goes_first_when_the_item_would_not_fit(
    limits: PlanLimits, reason: DispatchReason | None
) -> None:
    window = [item(), item()][: 2 if reason is DispatchReason.FULL else 1]
    assert admit(window, item(), limits, PREDICT, now=0.0) == Admission(reason, False)


# -- full_after_add -------------------------------------------------------------------


def test_full_after_add() -> None:
    assert full_after_add([], LIMITS) is None
    assert full_after_add([item()] * 7, LIMITS) is None
    assert full_after_add([item()] * 8, LIMITS) is DispatchReason.FULL
    one = (50 + 10) + (40 + 10)  # input + output of one item, no shared tokens
    assert (
        full_after_add([item()], PlanLimits(context_window=one, **FRAMES)) is DispatchReason.TOKENS
    )
    assert full_after_add([item()], PlanLimits(context_window=one + 1, **FRAMES)) is None
    assert (
        full_after_add([item()], PlanLimits(max_output_tokens=50, **FRAMES))
        is DispatchReason.TOKENS
    )
    assert (
        full_after_add([item(out=5000)], PlanLimits(max_output_tokens=4096, **FRAMES))
        is DispatchReason.TOKENS
    )


# -- due_at ---------------------------------------------------------------------------


def test_due_at_is_max_wait_after_the_first_arrival_when_deadlines_are_far() -> None:
    window = [item(arrival=3.0), item(arrival=2.0, deadline=60.0)]
    assert due(window, LIMITS, PREDICT) == Due(3.0, DispatchReason.WINDOW)
    assert due_at(window, LIMITS, PREDICT) == 3.0


def test_due_at_leaves_room_for_the_predicted_request_before_the_earliest_deadline() -> None:
    window = [item(arrival=2.0, deadline=5.0), item(arrival=2.5, deadline=4.0)]
    assert due_at(window, LIMITS, PREDICT) == pytest.approx(4.0 - 2.522)
    assert due(window, LIMITS, PREDICT).reason is DispatchReason.DEADLINE


def test_due_at_of_an_empty_window_is_never() -> None:
    assert due_at([], LIMITS, PREDICT) == math.inf
    assert due_at([item(deadline=1.0)], LIMITS, PREDICT) < 0  # overdue: dispatch at once


# -- streaming order ------------------------------------------------------------------


def test_streaming_order_puts_short_answers_first_and_is_stable() -> None:
    items = [item(out=30), item(out=10), item(out=30), item(out=5), item(out=10)]
    assert streaming_order(items) == [3, 1, 4, 0, 2]
    assert streaming_order([]) == []
    # Deadlines that every order meets change nothing.
    far = [item(out=o, deadline=100.0) for o in (30, 10, 30, 5, 10)]
    assert streaming_order(far, STREAMING, PREDICT, 0.0) == [3, 1, 4, 0, 2]


STREAMING = dataclasses.replace(LIMITS, streaming=True)


def test_a_long_item_goes_first_only_when_its_deadline_needs_it() -> None:
    # inputs 100 + 3 * 60 = 280 -> 0.528 s to the first token; 0.02 s per output token.
    long, short = item(out=90), item(out=10)
    # Last, the long item is answered at 0.528 + 0.02 * (20 + 20 + 100) = 3.328 s.
    relaxed = [dataclasses.replace(long, deadline=3.4), short, short]
    assert streaming_order(relaxed, STREAMING, PREDICT, 0.0) == [1, 2, 0]
    # Due by 2.6 s it must go first (answered at 2.528 s); the short ones then wait.
    urgent = [dataclasses.replace(long, deadline=2.6), short, short]
    assert streaming_order(urgent, STREAMING, PREDICT, 0.0) == [0, 1, 2]
    assert latest_start(urgent, STREAMING, PREDICT) == pytest.approx(2.6 - 2.528)
    # Without streaming everyone waits for the whole reply, 3.328 s.
    assert latest_start(urgent, LIMITS, PREDICT) == pytest.approx(2.6 - 3.328)


def test_streaming_lets_a_group_grow_past_what_a_whole_reply_allows() -> None:
    # 340 input tokens: 0.534 s to the first token, then 1 s per member (50 tokens).
    # The whole reply (4.534 s) is too late for the first, due at 2 s; written one by
    # one, they are answered at 1.534, 2.534, 3.534 and 4.534 s: all on time.
    window = [item(out=40, deadline=2.0 + 1.1 * k) for k in range(3)]
    new = item(out=40, deadline=10.0)
    assert admit(window, new, LIMITS, PREDICT, 0.0).dispatch_first is DispatchReason.DEADLINE
    assert admit(window, new, STREAMING, PREDICT, 0.0).dispatch_first is None
    assert due([*window, new], STREAMING, PREDICT).at == pytest.approx(
        min(2.0 + 1.1 * k - (0.534 + (k + 1)) for k in range(3))
    )


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.integers(0, 300), st.one_of(st.just(math.inf), st.floats(0.5, 12.0))),
        min_size=1,
        max_size=5,
    ),
    st.floats(0.0, 2.0),
)
def test_streaming_order_is_on_time_whenever_some_order_is_and_then_answers_soonest(
    raw: list[tuple[int, float]], start: float
) -> None:
    group = [PlanItem(50, out, deadline, 0.0) for out, deadline in raw]
    inputs, _ = group_tokens(group, STREAMING)

    def finishes(order: Sequence[int]) -> list[float]:
        written, times = 0, [0.0] * len(group)
        for index in order:
            written += group[index].output_tokens + STREAMING.per_item_output_overhead_tokens
            times[index] = start + PREDICT(inputs, written)
        return times

    def on_time(order: Sequence[int]) -> bool:
        return all(t <= m.deadline + 1e-9 for t, m in zip(finishes(order), group, strict=True))

    ours = streaming_order(group, STREAMING, PREDICT, start)
    assert sorted(ours) == list(range(len(group)))
    feasible = [p for p in itertools.permutations(range(len(group))) if on_time(p)]
    assert on_time(ours) == bool(feasible)
    assert (latest_start(group, STREAMING, PREDICT) >= start - 1e-9) == bool(feasible)
    if feasible:
        best = min(sum(finishes(p)) for p in feasible)
        assert sum(finishes(ours)) <= best + 1e-6


# -- properties -----------------------------------------------------------------------

items_strategy = st.lists(
    st.tuples(
        st.integers(0, 2000),  # input tokens
        st.integers(0, 300),  # output tokens
        st.floats(0.0, 2.0),  # gap since the previous arrival
        st.one_of(st.just(math.inf), st.floats(0.5, 20.0)),  # budget
    ),
    max_size=40,
)
limits_strategy = st.builds(
    PlanLimits,
    max_items=st.integers(1, 10),
    max_wait=st.floats(0.0, 3.0),
    shared_tokens=st.integers(0, 500),
    context_window=st.one_of(st.none(), st.integers(2000, 20000)),
    max_output_tokens=st.one_of(st.none(), st.integers(300, 2000)),
    streaming=st.booleans(),
    per_item_overhead_tokens=st.integers(0, 30),
    per_item_output_overhead_tokens=st.integers(0, 15),
)


def answered_at(group: Sequence[PlanItem], at: float, limits: PlanLimits) -> list[float]:
    """When each member is predicted to be answered, the request sent at ``at``: all at
    the end, or, streaming, each once the outputs before and including its own are
    written in :func:`streaming_order`."""
    inputs, outputs = group_tokens(group, limits)
    if not limits.streaming:
        return [at + PREDICT(inputs, outputs)] * len(group)
    finish = [0.0] * len(group)
    written = 0
    for index in streaming_order(group, limits, PREDICT, at):
        written += group[index].output_tokens + limits.per_item_output_overhead_tokens
        finish[index] = at + PREDICT(inputs, written)
    return finish


def simulate(
    raw: Sequence[tuple[int, int, float, float]], limits: PlanLimits
) -> list[tuple[list[PlanItem], float, bool]]:
    """Run the batcher's protocol over arrivals: (group, dispatched at, solo) per request."""
    sent: list[tuple[list[PlanItem], float, bool]] = []
    window: list[PlanItem] = []
    now = 0.0

    def flush(at: float) -> None:
        sent.append((list(window), at, False))
        window.clear()

    for inp, out, gap, budget in raw:
        now += gap
        if window and due_at(window, limits, PREDICT) <= now:  # the timer fired first
            flush(max(due_at(window, limits, PREDICT), window[-1].arrival))
        new = PlanItem(inp, out, now + budget, now)
        decision = admit(window, new, limits, PREDICT, now)
        if decision.solo:
            sent.append(([new], now, True))
            continue
        if decision.dispatch_first is not None:
            flush(now)
        window.append(new)
        if full_after_add(window, limits) is not None:
            flush(now)
    if window:
        flush(max(due_at(window, limits, PREDICT), window[-1].arrival))
    return sent


@given(items_strategy, limits_strategy)
def test_only_solo_requests_are_predicted_to_miss_a_deadline(
    raw: list[tuple[int, int, float, float]], limits: PlanLimits
) -> None:
    sent = simulate(raw, limits)
    assert sum(len(group) for group, _, _ in sent) == len(raw)
    for group, at, solo in sent:
        finishes = answered_at(group, at, limits)
        if solo:
            assert len(group) == 1
            assert finishes[0] > group[0].deadline
        else:
            for member, finish in zip(group, finishes, strict=True):
                assert finish <= member.deadline + 1e-9
            assert at <= min(i.arrival for i in group) + limits.max_wait + 1e-9
            assert len(group) <= limits.max_items


@given(items_strategy, limits_strategy)
def test_due_at_is_never_later_than_any_deadline_minus_the_prediction(
    raw: list[tuple[int, int, float, float]], limits: PlanLimits
) -> None:
    window = [PlanItem(i, o, gap + budget, gap) for i, o, gap, budget in raw]
    due = due_at(window, limits, PREDICT)
    for member, finish in zip(window, answered_at(window, due, limits), strict=True):
        if math.isfinite(due):
            assert finish <= member.deadline + 1e-9
        assert due <= member.arrival + limits.max_wait


def test_admit_works_with_the_latency_model() -> None:
    model = LatencyModel(LatencyPrior(overhead=0.5, prefill_per_token=1e-4, decode_per_token=0.02))

    def predict(i: int, o: int) -> float:
        return model.predict(i, o).total

    # With the default 1.3 margin one item takes 1.516 * 1.3 = 1.9708 s.
    assert admit([], item(deadline=1.96), LIMITS, predict, now=0.0).solo
    assert not admit([], item(deadline=1.98), LIMITS, predict, now=0.0).solo


# -- rate-limit headers ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1.5s", 1.5),
        ("1h2m3s", 3723.0),
        ("250us", 0.00025),
        ("3µs", 3e-6),
        ("0s", 0.0),
        ("12", 12.0),
        (" 7s ", 7.0),
        ("", None),
        ("soon", None),
        ("5 s", None),
        ("-1s", None),
        ("1x", None),
        ("inf", None),
        ("nan", None),
    ],
)
def test_parse_go_duration(text: str, seconds: float | None) -> None:
    assert parse_go_duration(text) == (None if seconds is None else pytest.approx(seconds))


@pytest.mark.parametrize("seconds", [0.02, 0.5, 1.0, 1.5, 12.0, 59.999, 360.0, 3725.25])
def test_parse_go_duration_reads_what_the_simulator_writes(seconds: float) -> None:
    assert parse_go_duration(go_duration(seconds)) == pytest.approx(seconds, abs=1e-3)


def test_openai_headers() -> None:
    headers = {
        "X-RateLimit-Limit-Requests": "5000",
        "x-ratelimit-remaining-requests": "4999",
        "x-ratelimit-reset-requests": "12ms",
        "x-ratelimit-limit-tokens": "80000",
        "x-ratelimit-remaining-tokens": "79000",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    state = parse_rate_limit_headers(headers, now=100.0)
    assert state == RateLimitState(
        Quota(4999, pytest.approx(100.012), 5000),  # type: ignore[arg-type]
        Quota(79000, 460.0, 80000),
    )


def test_anthropic_headers_from_the_simulator() -> None:
    decision = RateDecision(True, 0.0, SimQuota(50, 49, 30.0), SimQuota(40000, 1000, 2.0))
    headers = anthropic_headers(decision, unix_now=1_700_000_000.0)
    state = parse_rate_limit_headers(headers, now=5.0, unix_now=1_700_000_000.0)
    assert state == RateLimitState(Quota(49, 35.0, 50), Quota(1000, 7.0, 40000))


def test_anthropic_reset_falls_back_to_the_date_header_then_to_unknown() -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "3",
        "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:30Z",
    }
    with_date = {**headers, "date": "Tue, 14 Nov 2023 22:13:20 GMT"}
    assert parse_rate_limit_headers(with_date, now=1.0).requests == Quota(3, 11.0)
    assert parse_rate_limit_headers(headers, now=1.0).requests == Quota(3, None)


def test_unreadable_headers_count_as_missing() -> None:
    headers = {
        "x-ratelimit-remaining-requests": "many",
        "x-ratelimit-remaining-tokens": "10",
        "x-ratelimit-reset-tokens": "later",
        "x-ratelimit-limit-tokens": "-4",
        "date": "yesterday",
    }
    assert parse_rate_limit_headers(headers, now=0.0) == RateLimitState(None, Quota(10))
    assert parse_rate_limit_headers({}, now=0.0) == RateLimitState()
    bad_reset = {
        "anthropic-ratelimit-tokens-remaining": "1",
        "anthropic-ratelimit-tokens-reset": "x",
    }
    assert parse_rate_limit_headers(bad_reset, now=0.0, unix_now=0.0).tokens == Quota(1)


def test_a_reset_in_the_past_is_now() -> None:
    headers = {
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": "1970-01-01T00:00:05+00:00",
    }
    state = parse_rate_limit_headers(headers, now=3.0, unix_now=10.0)
    assert state.tokens == Quota(0, 3.0)


# -- binding limit, packing, re-asks --------------------------------------------------

# 10 requests or 10,000 tokens left, both resetting in 10 s.
STATE = RateLimitState(Quota(10, 10.0), Quota(10_000, 10.0))


@pytest.mark.parametrize(
    ("pace", "binding"),
    [
        (Pace(0.5, 500.0), None),  # 5 requests, 2,500 tokens in 10 s
        (Pace(2.0, 200.0), "requests"),  # out of requests after 5 s, tokens after 25 s
        (Pace(2.0, 2_000.0), "tokens"),  # out of tokens after 2.5 s
        (Pace(2.0, 1_000.0), "requests"),  # both after 5 s: a tie goes to requests
        (Pace(0.0, 1_000.0), None),
    ],
)
def test_binding_limit(pace: Pace, binding: str | None) -> None:
    assert binding_limit(STATE, pace, now=0.0) == binding


def test_binding_limit_edge_cases() -> None:
    pace = Pace(1.0, 100.0)
    assert binding_limit(RateLimitState(), pace, now=0.0) is None
    empty = RateLimitState(tokens=Quota(0, 5.0))
    assert binding_limit(empty, Pace(0.0, 0.0), now=0.0) == "tokens"
    assert binding_limit(empty, pace, now=5.0) is None  # it has just reset
    # Without a reset time, a minute: 30 requests at 1/s run out first.
    assert binding_limit(RateLimitState(Quota(30)), pace, now=0.0) == "requests"
    assert binding_limit(RateLimitState(Quota(90)), pace, now=0.0) is None


def test_pack_more_spaces_requests_when_they_bind() -> None:
    limits = PlanLimits(max_wait=0.05)
    assert pack_more(STATE, limits, Pace(2.0, 200.0), now=0.0).max_wait == 1.0  # 10 s / 10
    # 4 s to the reset: at 5/s the 10 requests last 2 s.
    assert pack_more(STATE, limits, Pace(5.0, 200.0), now=6.0).max_wait == 0.4
    assert pack_more(STATE, limits, Pace(2.0, 200.0), now=6.0) is limits  # 5 s: they last
    spent = RateLimitState(Quota(0, 7.0))
    assert pack_more(spent, limits, Pace(1.0, 1.0), now=4.0).max_wait == 3.0
    slow = PlanLimits(max_wait=2.0)
    assert pack_more(STATE, slow, Pace(2.0, 200.0), now=0.0) == slow


@pytest.mark.parametrize("pace", [Pace(0.5, 500.0), Pace(2.0, 2_000.0)])
def test_pack_more_leaves_limits_alone_unless_requests_bind(pace: Pace) -> None:
    assert pack_more(STATE, LIMITS, pace, now=0.0) is LIMITS


def test_allow_reask_refuses_only_when_tokens_bind_and_the_answer_would_be_late() -> None:
    tokens_bind = Pace(2.0, 2_000.0)
    # 1,000 input + 50 output: 0.5 + 0.1 + 1.0 = 1.6 s.
    size = {"input_tokens": 1000, "output_tokens": 50, "predict": PREDICT}
    assert allow_reask(STATE, tokens_bind, 0.0, deadline=1.6, **size)  # type: ignore[arg-type]
    assert not allow_reask(STATE, tokens_bind, 0.0, deadline=1.5, **size)  # type: ignore[arg-type]
    calm = Pace(0.5, 500.0)
    assert allow_reask(STATE, calm, 0.0, deadline=1.5, **size)  # type: ignore[arg-type]
    # Too few tokens left: the re-ask starts at the reset, 10 s away.
    low = RateLimitState(Quota(10, 10.0), Quota(500, 10.0))
    assert not allow_reask(low, tokens_bind, 0.0, deadline=11.5, **size)  # type: ignore[arg-type]
    assert allow_reask(low, tokens_bind, 0.0, deadline=11.6, **size)  # type: ignore[arg-type]

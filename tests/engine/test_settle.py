"""The re-ask rule: a pure function of outcomes, attempts and time left, tested by hand."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coalesce import InvalidOutputError, MissingOutputError
from coalesce._engine.settle import Settlement, give_up_error, settle
from coalesce._wire.outcomes import FailureKind, ItemFailure

MISSING = ItemFailure(FailureKind.MISSING, None, "no output")
INVALID = ItemFailure(FailureKind.INVALID, "high", "not an object")


def test_values_go_out_and_failures_with_attempts_left_are_asked_again() -> None:
    decided = settle(
        {"1": "ok", "2": MISSING, "3": INVALID},
        {"1": 1, "2": 1, "3": 3},
        max_attempts=3,
        took=1.0,
        time_left=5.0,
    )
    assert decided == Settlement({"1": "ok"}, {"3": INVALID}, ("2",))


def test_no_reask_when_a_request_like_this_one_no_longer_fits() -> None:
    decided = settle({"1": MISSING}, {"1": 1}, max_attempts=4, took=2.0, time_left=1.99)
    assert decided == Settlement({}, {"1": MISSING}, ())
    fits = settle({"1": MISSING}, {"1": 1}, max_attempts=4, took=2.0, time_left=2.0)
    assert fits.reask == ("1",)


def test_one_attempt_means_never_ask_again() -> None:
    decided = settle({"1": MISSING}, {"1": 1}, max_attempts=1, took=0.0, time_left=60.0)
    assert decided.give_up == {"1": MISSING}
    assert decided.reask == ()


def test_the_token_quota_may_refuse_the_whole_reask() -> None:
    asked: list[Sequence[str]] = []

    def refuse(ids: Sequence[str]) -> bool:
        asked.append(ids)
        return False

    outcomes = {"1": MISSING, "2": INVALID, "3": 7}
    attempts = {"1": 1, "2": 1, "3": 1}
    decided = settle(outcomes, attempts, max_attempts=4, took=1, time_left=9, may_reask=refuse)
    assert asked == [("1", "2")]
    assert decided == Settlement({"3": 7}, {"1": MISSING, "2": INVALID}, ())
    allowed = settle(outcomes, attempts, max_attempts=4, took=1, time_left=9, may_reask=bool)
    assert allowed.reask == ("1", "2")


def test_the_quota_is_not_asked_when_nothing_is_reasked() -> None:
    def never(ids: Sequence[str]) -> bool:
        raise AssertionError("asked without a re-ask")

    decided = settle({"1": "ok"}, {"1": 1}, max_attempts=4, took=1, time_left=9, may_reask=never)
    assert decided.values == {"1": "ok"}


def test_give_up_errors_say_why() -> None:
    exhausted = give_up_error("2", INVALID, attempts=4, max_attempts=4)
    assert isinstance(exhausted, InvalidOutputError)
    assert "no time left" not in str(exhausted)
    late = give_up_error("2", INVALID, attempts=1, max_attempts=4)
    assert "no time left in the latency budget" in str(late)
    assert late.attempts == 1
    assert isinstance(give_up_error("1", MISSING, 2, 4), MissingOutputError)


@given(
    st.dictionaries(
        st.text("0123456789", min_size=1, max_size=3),
        st.tuples(st.booleans(), st.integers(1, 5)),
        max_size=12,
    ),
    st.integers(1, 5),
    st.floats(0, 10),
    st.floats(-1, 10),
)
def test_every_id_gets_exactly_one_decision(
    cases: dict[str, tuple[bool, int]], max_attempts: int, took: float, time_left: float
) -> None:
    outcomes = {i: (MISSING if failed else i) for i, (failed, _) in cases.items()}
    attempts = {i: n for i, (_, n) in cases.items()}
    decided = settle(outcomes, attempts, max_attempts=max_attempts, took=took, time_left=time_left)
    groups = [set(decided.values), set(decided.give_up), set(decided.reask)]
    assert set().union(*groups) == set(outcomes)
    assert sum(map(len, groups)) == len(outcomes)
    for item_id in decided.reask:
        assert attempts[item_id] < max_attempts
        assert took <= time_left


@pytest.mark.parametrize("kind", list(FailureKind))
def test_every_failure_kind_is_asked_again_while_attempts_last(kind: FailureKind) -> None:
    failure = ItemFailure(kind, None, "")
    assert settle({"1": failure}, {"1": 1}, max_attempts=2, took=0, time_left=1).reask == ("1",)

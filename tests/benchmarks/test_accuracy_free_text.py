"""The accuracy benchmark's free-text task (``product``, issue 37): its items, and that
its score is the library's own free-text comparison (what the shadow guard uses).

Pure: no model, no network.
"""

from __future__ import annotations

import re

import pydantic
import pytest
from _accuracy_tasks import PRODUCTS, make_task, names_product
from bench_accuracy import Outcome, Run, answer_pattern

from coalesce._accuracy.texts import agreement_for

NAMES = [name for _, name in PRODUCTS]


def test_product_answers_follow_from_the_text() -> None:
    task = make_task("product", 300, seed=7)
    assert task.output is str
    second = 0
    for item in task.items:
        mentioned = [name for name in NAMES if name in item.text]
        assert item.answer in mentioned, item.text
        if len(mentioned) == 2:  # the one chosen or bought, not the one it replaced
            second += 1
            chosen = re.search(r"(?:with|chose) the (.+?)(?: for my | in [A-Z])", item.text)
            assert chosen is not None, item.text
            if "replaced" in item.text:
                assert chosen.group(1) == item.answer, item.text
            else:
                assert chosen.group(1) != item.answer, item.text  # "comparing it with"
                assert f"I chose the {item.answer}" in item.text
        else:
            assert len(mentioned) == 1, item.text
    assert 0.35 < second / len(task.items) < 0.65


def test_product_items_are_deterministic_and_distinct() -> None:
    first = make_task("product", 200, seed=3)
    assert first == make_task("product", 200, seed=3)
    assert len({item.text for item in first.items}) == 200
    assert make_task("product", 200, seed=4).items != first.items


@pytest.mark.parametrize(
    ("answer", "right"),
    [
        ("Kindle Paperwhite e-reader", True),
        ("the Kindle Paperwhite.", True),  # other words, the same answer
        ("Paperwhite e-reader", True),
        ("Kindle", False),  # too little of the name: F1 0.4
        ("Kobo Clara e-reader", False),  # another product of the same kind: F1 0.5
        ("e-reader", True),  # the measure's known false agree, the kind alone (F1 0.67)
        ("Dyson V15 cordless vacuum", False),
    ],
)
def test_product_is_scored_by_the_librarys_free_text_measure(answer: str, right: bool) -> None:
    task = make_task("product", 40, seed=1)
    index = next(i for i, item in enumerate(task.items) if item.answer.startswith("Kindle"))
    guard = agreement_for(pydantic.TypeAdapter(str).json_schema(), None)
    assert guard is not None
    assert task.is_right(index, answer) is right
    assert guard(answer, task.items[index].answer) is right  # what the shadow guard decides


def test_the_check_names_the_product_by_its_distinctive_word() -> None:
    assert names_product("Paperwhite", "Kindle Paperwhite e-reader")
    assert names_product("I bought the Kindle Paperwhite", "Kindle Paperwhite e-reader")
    assert not names_product("e-reader", "Kindle Paperwhite e-reader")  # the measure: right
    assert not names_product("Kobo or Paperwhite", "Kindle Paperwhite e-reader")
    assert not names_product(None, "Kindle Paperwhite e-reader")


def test_a_wrong_answer_in_a_neighbours_words_is_counted_as_crossed() -> None:
    task = make_task("product", 40, seed=1)
    a, b = next((0, j) for j in range(1, 4) if task.items[j].answer != task.items[0].answer)
    outcomes = [Outcome(i, answer=task.items[i].answer, request=0) for i in range(4)]
    for outcome in outcomes:
        outcome.correct = True
    neighbour = task.items[b].answer.split()
    outcomes[a] = Outcome(a, answer=" ".join(neighbour[:2]), correct=False, request=0)
    assert task.same(outcomes[a].answer, task.items[b].answer)  # the neighbour's, reworded
    run = Run("coalesce, max_items=4", 4, outcomes)
    assert answer_pattern(task, run) == "1 of 1 wrong: a neighbour's answer"

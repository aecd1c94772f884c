"""The free-text agreement measure on a real model's answers (issue 37): its error rates.

A free-text task whose answers can be labelled without the measure: each item is a short
review of one product of a catalogue, and the task is to name the product. An answer
*names* a product when it holds that product's distinctive word ("Paperwhite",
"Roomba"); two answers are the **same answer** when both name the same one product, a
**different answer** when they name different ones (or one names none). The measure,
:func:`coalesce._accuracy.texts.answers_agree`, never sees the catalogue.

Pairs, all of the model's own answers:

* **packed and plain**: each item asked alone (temperature 0) and in packed groups of
  ``k`` through ``@coalesce.prompt`` (``packing="always"``), the pairs the shadow guard
  compares; packing's wrong answers (another item's product) are the different ones;
* **plain and plain, resampled**: each item asked alone again at temperature 1, the
  model's own variation in wording (the noise floor: these should agree).

Per threshold of the token F1: the false-agree rate (different answers judged to agree)
and the false-disagree rate (same answers judged to differ), with 95% intervals.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import openai
from _accuracy_stats import wilson_interval

import coalesce
from coalesce._accuracy.texts import token_f1, words

#: (distinctive word, the name a review uses): the labels come from the first.
PRODUCTS = (
    ("paperwhite", "Kindle Paperwhite e-reader"),
    ("roomba", "iRobot Roomba robot vacuum"),
    ("airpods", "Apple AirPods Pro earbuds"),
    ("nespresso", "Nespresso Vertuo coffee machine"),
    ("fitbit", "Fitbit Charge fitness tracker"),
    ("instant", "Instant Pot pressure cooker"),
    ("switch", "Nintendo Switch console"),
    ("gopro", "GoPro Hero action camera"),
    ("dyson", "Dyson V15 cordless vacuum"),
    ("thinkpad", "Lenovo ThinkPad laptop"),
    ("echo", "Amazon Echo Dot smart speaker"),
    ("vitamix", "Vitamix blender"),
    ("kobo", "Kobo Clara e-reader"),
    ("bose", "Bose QuietComfort headphones"),
    ("garmin", "Garmin Forerunner running watch"),
    ("ipad", "Apple iPad Air tablet"),
)
INSTRUCTIONS = (
    "You read short customer reviews. For each review, name the product it is about,"
    " in a few words, as the customer would (brand and model where given)."
)
_OPENINGS = ("I bought the {} for my {} last {}.", "My {1} gave me the {0} in {2}.")
_PEOPLE = ("sister", "father", "office", "son", "neighbour", "team")
_MONTHS = ("March", "June", "September", "December")
_VERDICTS = (
    "It works well and I use it every day.",
    "It stopped working after a week, very disappointing.",
    "Good value, though the manual is confusing.",
    "Not worth the price in my opinion.",
)


def reviews(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` reviews, each with the distinctive word of its product."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        key, name = rng.choice(PRODUCTS)
        opening = rng.choice(_OPENINGS).format(name, rng.choice(_PEOPLE), rng.choice(_MONTHS))
        out.append((f"{opening} {rng.choice(_VERDICTS)}", key))
    return out


def named(answer: str) -> set[str]:
    """The catalogue's products an answer names (by their distinctive words)."""
    said = set(words(answer))
    return {key for key, _ in PRODUCTS if key in said}


def same(first: str, second: str) -> bool | None:
    """The label of a pair: the same product, another one, or ``None`` (unlabelled:
    neither names exactly one)."""
    a, b = named(first), named(second)
    if len(a) != 1 and len(b) != 1:
        return None
    return a == b and len(a) == 1


async def plain_answers(
    url: str, model: str, texts: Sequence[str], temperature: float
) -> list[str]:
    async with openai.AsyncOpenAI(base_url=url, api_key="x", timeout=900.0) as client:
        answers = [""] * len(texts)
        limiter = anyio.CapacityLimiter(2)

        async def one(i: int) -> None:
            async with limiter:
                reply = await client.chat.completions.create(
                    model=model,
                    messages=[
                        {"role": "system", "content": INSTRUCTIONS},
                        {"role": "user", "content": texts[i]},
                    ],
                    temperature=temperature,
                    max_tokens=24,
                )
            answers[i] = reply.choices[0].message.content or ""

        async with anyio.create_task_group() as tg:
            for i in range(len(texts)):
                tg.start_soon(one, i)
    return answers


async def packed_answers(url: str, model: str, texts: Sequence[str], k: int) -> list[str]:
    async def product(review: str) -> str: ...

    fn = coalesce.prompt(
        client=openai.AsyncOpenAI(base_url=url, api_key="x", timeout=900.0),
        model=model,
        instructions=INSTRUCTIONS,
        max_items=k,
        max_wait=3600.0,
        max_concurrency=2,
        packing="always",
        shadow=0,
        store=":memory:",
        temperature=0,
    )(product)
    answers: list[Any] = [None] * len(texts)

    async def one(i: int) -> None:
        answers[i] = await fn(texts[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(texts)):
            tg.start_soon(one, i)
        await anyio.sleep(0.5)
        await fn.aclose()
    return [str(a) for a in answers]


def containment(first: str, second: str) -> float:
    """The share of the shorter answer's words that the longer one holds (for
    comparison with the token F1: it forgives a verbose answer)."""
    a, b = Counter(words(first)), Counter(words(second))
    if not a or not b:
        return float(a == b)
    return sum((a & b).values()) / min(a.total(), b.total())


MEASURES: dict[str, Callable[[str, str], float]] = {
    "token F1": token_f1,
    "containment": containment,
}


def rates(
    pairs: Sequence[tuple[str, str, bool]], threshold: float, measure: Callable[[str, str], float]
) -> list[str]:
    """False agrees among the different pairs, false disagrees among the same ones,
    at ``threshold``."""
    cells = []
    for label in (False, True):
        mine = [measure(a, b) > threshold for a, b, s in pairs if s is label]
        wrong = sum(mine) if label is False else len(mine) - sum(mine)
        low, high = wilson_interval(wrong, len(mine)) if mine else (0.0, 1.0)
        cells.append(f"{wrong}/{len(mine)} ({low:.0%}-{high:.0%})")
    return cells


async def calibrate(url: str, model: str, n: int, sizes: Sequence[int], seed: int) -> None:
    """Print the labelled pairs' counts and the error rates by threshold."""
    items = reviews(n, seed)
    texts = [text for text, _ in items]
    plain = await plain_answers(url, model, texts, 0.0)
    again = await plain_answers(url, model, texts, 1.0)
    pairs: list[tuple[str, str, bool]] = []
    sources = {"plain, resampled at temperature 1": again}
    for k in sizes:
        sources[f"packed k={k}"] = await packed_answers(url, model, texts, k)
    print(f"\n## The free-text measure: {n} product reviews, seed {seed}\n")
    print("| pairs | labelled | same | different | right alone |")
    print("|---|---:|---:|---:|---:|")
    right = sum(named(p) == {key} for p, (_, key) in zip(plain, items, strict=True))
    for name, answers in sources.items():
        labelled = [(a, p, same(a, p)) for a, p in zip(answers, plain, strict=True)]
        kept = [(a, p, s) for a, p, s in labelled if s is not None]
        pairs += kept
        n_same = sum(s for _, _, s in kept)
        print(f"| {name} | {len(kept)} | {n_same} | {len(kept) - n_same} | {right}/{n} |")
    heads = " | ".join(f"{m}: false agree | {m}: false disagree" for m in MEASURES)
    print(f"\n| above | {heads} |")
    print("|---:|" + "---:|" * 2 * len(MEASURES))
    for threshold in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        cells = [c for m in MEASURES.values() for c in rates(pairs, threshold, m)]
        print(f"| {threshold:.2f} | " + " | ".join(cells) + " |")
    print("\nat the default (token F1 above 0.5), by source:")
    for name, answers in sources.items():
        mine = [(a, p, same(a, p)) for a, p in zip(answers, plain, strict=True)]
        kept = [(a, p, s) for a, p, s in mine if s is not None]
        print(f"- {name}: " + ", ".join(rates(kept, 0.5, token_f1)))
    print("\nthe pairs the token F1 misjudges at 0.5 (other | plain | label | F1):")
    for a, p, s in [x for x in pairs if (token_f1(x[0], x[1]) > 0.5) != x[2]]:
        print(f"- {a!r} | {p!r} | {'same' if s else 'different'} | {token_f1(a, p):.2f}")

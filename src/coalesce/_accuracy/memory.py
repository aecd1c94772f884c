"""The learned group cap and its evidence, kept between processes.

One small JSON file per function (``caps/<key>.json`` next to the job store: in
``$COALESCE_STORE``'s directory, else the user data directory), named by the model
and a digest of the instructions and output schema, so a restarted process, or
another process of the same app, starts where the last one stopped. Written
atomically (a temporary file renamed over the old one); two processes learning the
same function at once each keep their own evidence and the last to write wins.
A file that cannot be read or written never breaks a call: it is logged, and
learning starts afresh (or goes on unsaved).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._paths import default_store_path

__all__ = ["CapMemory", "Evidence", "memory_dir"]

logger = logging.getLogger("coalesce")

#: The file format's version: another is ignored (learning starts afresh).
VERSION = 1
#: The directories this process has said it keeps caps in.
_ANNOUNCED: set[Path] = set()
_WHERE = (
    "coalesce: learned group caps are kept in %s (store= or COALESCE_STORE moves them,"
    " ':memory:' keeps them in memory only)"
)


@dataclass
class Evidence:
    """What the shadow guard knows of one function's cap (see
    :class:`~coalesce._accuracy.shadow.ShadowGuard`)."""

    cap: int
    bad: int | None = None
    counts: dict[int, tuple[int, int]] = field(default_factory=dict)
    recent: dict[int, list[bool]] = field(default_factory=dict)
    tail: list[bool] = field(default_factory=list)
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)
    learning_requests: int = 0
    moves: list[tuple[int, int, str]] = field(default_factory=list)


def memory_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the caps are kept: ``caps/`` beside the job store's file
    (:func:`~coalesce._paths.default_store_path`: ``$COALESCE_STORE``'s directory, else
    the user data directory).

    Args:
        env: Where ``COALESCE_STORE`` is read (default: ``os.environ``).
    """
    return default_store_path(env).parent / "caps"


class CapMemory:
    """One function's evidence on disk.

    Args:
        path: The JSON file.
        model: The model's name, written beside the evidence for whoever reads it.
    """

    def __init__(self, path: Path, model: str = "") -> None:
        self.path, self.model = path, model

    @classmethod
    def for_key(cls, key: str, model: str = "", directory: Path | None = None) -> CapMemory:
        """The memory of the function whose prompt-cache key is ``key``."""
        return cls((directory or memory_dir()) / f"{key}.json", model)

    def load(self) -> Evidence | None:
        """The evidence kept, or ``None`` (none yet, or unreadable: logged)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("coalesce: cannot read %s (%s); learning the cap afresh", self.path, exc)
            return None
        try:
            return _evidence(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            logger.warning(
                "coalesce: %s is not a cap file this version reads (%s); learning the cap afresh",
                self.path,
                exc,
            )
            return None

    def save(self, evidence: Evidence) -> None:
        """Write ``evidence`` atomically; a failure is logged, never raised."""
        data = {"version": VERSION, "model": self.model, **asdict(evidence)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=".cap-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    json.dump(data, out)
                os.replace(temporary, self.path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as exc:
            logger.warning("coalesce: cannot save the learned cap to %s (%s)", self.path, exc)
            return
        if self.path.parent not in _ANNOUNCED:  # once per directory and process
            _ANNOUNCED.add(self.path.parent)
            logger.info(_WHERE, self.path.parent)

    def __repr__(self) -> str:
        return f"CapMemory({str(self.path)!r})"


def _evidence(data: Any) -> Evidence:
    """The evidence in a file's JSON, checked field by field.

    Raises:
        ValueError: Another version, or a field of the wrong shape.
    """
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError("another version")
    cap = _count(data["cap"], 1)
    bad = None if data.get("bad") is None else _count(data["bad"], 1)
    return Evidence(
        cap=cap,
        bad=bad,
        counts={_count(k, 1): _pair(v) for k, v in dict(data["counts"]).items()},
        recent={_count(k, 1): _votes(v) for k, v in dict(data["recent"]).items()},
        tail=_votes(data["tail"]),
        positions={_count(k, 1): _pair(v) for k, v in dict(data["positions"]).items()},
        learning_requests=_count(data.get("learning_requests", 0), 0),
        moves=[(_count(a, 1), _count(b, 1), str(why)) for a, b, why in data.get("moves", [])],
    )


def _count(value: Any, minimum: int) -> int:
    number = int(value)
    if isinstance(value, bool) or number < minimum or str(number) != str(value).strip():
        raise ValueError(f"not a whole number >= {minimum}: {value!r}")
    return number


def _pair(value: Any) -> tuple[int, int]:
    agreed, total = (_count(v, 0) for v in value)
    if agreed > total:
        raise ValueError(f"more agreed than judged: {value!r}")
    return agreed, total


def _votes(value: Any) -> list[bool]:
    if not isinstance(value, list) or not all(isinstance(v, bool) for v in value):
        raise ValueError("verdicts are not a list of true and false")
    return list(value)

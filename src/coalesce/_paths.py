"""Where coalesce keeps its files: ``$COALESCE_STORE``, else the user data directory.

The job store (:mod:`coalesce._lanes.store`) is the file ``$COALESCE_STORE`` names,
else ``jobs.sqlite3`` in the user data directory that ``platformdirs`` names; the
learned group caps (:mod:`coalesce._accuracy.memory`) are kept in ``caps/`` beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

__all__ = ["default_store_path"]


def default_store_path(env: Mapping[str, str] | None = None) -> Path:
    """The job store's file by default.

    ``$COALESCE_STORE`` (a file path, ``~`` expanded) if set and not empty; otherwise
    ``jobs.sqlite3`` in ``platformdirs.user_data_dir("coalesce", appauthor=False)``:
    ``~/.local/share/coalesce`` (or ``$XDG_DATA_HOME/coalesce``) on Linux,
    ``~/Library/Application Support/coalesce`` on macOS, ``%LOCALAPPDATA%\\coalesce``
    on Windows.

    Args:
        env: Where ``COALESCE_STORE`` is read (default: ``os.environ``).
    """
    override = (os.environ if env is None else env).get("COALESCE_STORE", "")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("coalesce", appauthor=False)) / "jobs.sqlite3"

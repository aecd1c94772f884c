"""Where the job store lives by default: ``$COALESCE_STORE``, or the user data directory."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["default_store_path", "store_path_for"]


def store_path_for(platform: str, env: Mapping[str, str], home: Path) -> Path:
    """The default store file for a platform (``sys.platform``), environment and home.

    ``$COALESCE_STORE`` (a file path) wins; otherwise ``coalesce/jobs.sqlite3`` in the
    user data directory: ``$XDG_DATA_HOME`` (if absolute) or ``~/.local/share`` on
    Linux, ``~/Library/Application Support`` on macOS, ``%LOCALAPPDATA%`` on Windows.
    These are the directories ``platformdirs.user_data_dir("coalesce")`` names.
    """
    override = env.get("COALESCE_STORE", "")
    if override:
        return Path(override).expanduser()
    return _user_data_dir(platform, env, home) / "coalesce" / "jobs.sqlite3"


def _user_data_dir(platform: str, env: Mapping[str, str], home: Path) -> Path:
    if platform == "win32":
        local = env.get("LOCALAPPDATA", "")
        return Path(local) if local else home / "AppData" / "Local"
    if platform == "darwin":
        return home / "Library" / "Application Support"
    xdg = env.get("XDG_DATA_HOME", "").strip()
    return Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".local" / "share"


def default_store_path() -> Path:
    """This user's default store file (see :func:`store_path_for`)."""
    return store_path_for(sys.platform, os.environ, Path.home())

"""``coalesce serve``'s settings: one table of defaults, read from flags, the
environment and a configuration file, checked once.

Each setting has one name, spelled three ways: ``--max-items`` on the command line,
``COALESCE_MAX_ITEMS`` in the environment, ``max_items`` in a JSON (or, on Python
3.11+, TOML) file given with ``--config``. A flag beats the environment, which beats
the file, which beats the default. Secrets (the client keys of ``--api-key`` mode, the
upstream keys) never appear in ``repr`` or in an error message.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .._defaults import (
    BATCH_WINDOW,
    POLL_INTERVAL,
    PROMPT_MAX_ITEMS,
    PROMPT_MAX_WAIT,
    wait_for_company,
)
from .._engine.spec import LANE_CHOICES
from .._exceptions import ConfigurationError

__all__ = ["DEFAULTS", "ENV_PREFIX", "GatewayConfig", "build_parser", "load_config"]

#: The environment variables' prefix: ``COALESCE_BUDGET``, ``COALESCE_MAX_ITEMS``, ...
ENV_PREFIX = "COALESCE_"

#: Every default, in one place (the flags' help reads them from here).
DEFAULTS: Mapping[str, Any] = {
    "host": "127.0.0.1",
    "port": 8080,
    "openai_upstream": "https://api.openai.com/v1",
    "anthropic_upstream": "https://api.anthropic.com",
    "budget": None,
    "lane": "auto",
    "max_items": PROMPT_MAX_ITEMS,
    "max_wait": PROMPT_MAX_WAIT,
    "max_retries": 0,
    "upstream_timeout": 600.0,
    "max_body_size": 16 * 1024 * 1024,
    "store": None,
    "batch_window": BATCH_WINDOW,
    "poll_interval": POLL_INTERVAL,
    "api_keys": (),
    "graceful_timeout": 30.0,
    "log_level": "info",
}

_SECRET = "<hidden>"
_LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class GatewayConfig:
    """What one gateway runs with (see ``docs/gateway.md``).

    Attributes:
        host: The interface to bind (``127.0.0.1``: this machine only).
        port: The port; 0 picks a free one.
        openai_upstream: The OpenAI API's base URL, ``/v1`` included.
        anthropic_upstream: The Anthropic API's base URL, without ``/v1``.
        budget: Seconds a call may take end to end unless its ``x-coalesce-budget``
            header says otherwise; with a budget, groups are sized against it.
        lane: The lane of a call without an ``x-coalesce-lane`` header (``auto``,
            ``realtime``, ``flex`` or ``batch``; see ``docs/lanes.md``).
        max_items: Most calls in one upstream request.
        max_wait: Longest wait for company, in seconds (default: 0.05, or a quarter of
            ``budget`` when there is one).
        max_retries: Retries of a failed upstream request inside the gateway (the
            clients' SDKs retry too; 0 leaves retrying to them).
        upstream_timeout: Longest one upstream request may run, in seconds.
        max_body_size: Largest body of a coalesced call, in bytes (16 MiB); a larger one
            gets a 413. Proxied paths (file uploads) stream their bodies through unread.
        store: The batch lane's durable job store (a SQLite file; default: the job
            store of every coalesce process, ``COALESCE_STORE`` or the user data
            directory). Given, the gateway finishes at startup the jobs an earlier one
            left there with its own upstream key (``--api-key`` mode).
        batch_window: Seconds a batch-lane call waits for others before their job is
            sent (also the flex lane's longest wait for company).
        poll_interval: The longest wait between two polls of a batch job.
        api_keys: The keys clients must present in ``--api-key`` mode (the gateway
            then sends upstream with ``openai_api_key`` / ``anthropic_api_key``);
            empty: each call's own credential is sent upstream with it.
        openai_api_key: The upstream OpenAI key of ``--api-key`` mode.
        anthropic_api_key: The upstream Anthropic key of ``--api-key`` mode.
        graceful_timeout: Seconds a stopping gateway waits for calls in flight.
        log_level: ``debug``, ``info``, ``warning`` or ``error``.
    """

    host: str = DEFAULTS["host"]
    port: int = DEFAULTS["port"]
    openai_upstream: str = DEFAULTS["openai_upstream"]
    anthropic_upstream: str = DEFAULTS["anthropic_upstream"]
    budget: float | None = DEFAULTS["budget"]
    lane: str = DEFAULTS["lane"]
    max_items: int = DEFAULTS["max_items"]
    max_wait: float = DEFAULTS["max_wait"]
    max_retries: int = DEFAULTS["max_retries"]
    upstream_timeout: float = DEFAULTS["upstream_timeout"]
    max_body_size: int = DEFAULTS["max_body_size"]
    store: Path | None = DEFAULTS["store"]
    batch_window: float = DEFAULTS["batch_window"]
    poll_interval: float = DEFAULTS["poll_interval"]
    api_keys: tuple[str, ...] = field(default=DEFAULTS["api_keys"], repr=False)
    openai_api_key: str | None = field(default=None, repr=False)
    anthropic_api_key: str | None = field(default=None, repr=False)
    graceful_timeout: float = DEFAULTS["graceful_timeout"]
    log_level: str = DEFAULTS["log_level"]

    def __post_init__(self) -> None:
        _check(self)

    @property
    def holds_keys(self) -> bool:
        """``--api-key`` mode: the gateway checks client keys and holds the upstream ones."""
        return bool(self.api_keys)

    @property
    def lanes(self) -> dict[str, Any]:
        """``coalesce.wrap``'s lane keywords for these settings (``lane``, ``store``,
        ``batch_window``, ``poll_interval``)."""
        return {
            "lane": self.lane,
            "store": self.store,
            "batch_window": self.batch_window,
            "poll_interval": self.poll_interval,
        }

    def describe(self) -> str:
        """One line of the settings, secrets left out (the startup log line)."""
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        shown["max_wait"] = wait_for_company(self.max_wait, self.budget)  # what it is
        shown["api_key_mode"] = self.holds_keys
        return " ".join(f"{name}={value}" for name, value in shown.items())


def _check(config: GatewayConfig) -> None:
    """Refuse a setting out of range, naming it, its value and what is valid."""
    if not 0 <= config.port <= 65535:
        raise ConfigurationError(f"port must be from 0 to 65535 (0: a free one), got {config.port}")
    for name in ("openai_upstream", "anthropic_upstream"):
        url = getattr(config, name)
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"{name} must be an http:// or https:// URL, got {url!r}")
    if config.budget is not None:
        _positive("budget", config.budget)
    _positive("max_wait", config.max_wait, zero=True)
    _positive("upstream_timeout", config.upstream_timeout)
    _positive("graceful_timeout", config.graceful_timeout, zero=True)
    if config.lane not in LANE_CHOICES:
        raise ConfigurationError(
            f"lane must be one of {', '.join(LANE_CHOICES)}, got {config.lane!r}"
        )
    _positive("batch_window", config.batch_window, zero=True)
    _positive("poll_interval", config.poll_interval)
    if config.max_body_size < 1:
        raise ConfigurationError(
            f"max_body_size must be a number of bytes >= 1, got {config.max_body_size}"
        )
    if config.max_items < 1 or config.max_retries < 0:
        raise ConfigurationError(
            f"max_items must be >= 1 and max_retries >= 0, got {config.max_items} and"
            f" {config.max_retries}"
        )
    if config.log_level not in _LOG_LEVELS:
        raise ConfigurationError(
            f"log_level must be one of {', '.join(_LOG_LEVELS)}, got {config.log_level!r}"
        )
    if any(not key.strip() for key in config.api_keys):
        raise ConfigurationError("api_keys: a client key is empty; give non-empty keys")
    if config.holds_keys and not (config.openai_api_key or config.anthropic_api_key):
        raise ConfigurationError(
            "--api-key mode sends upstream with the gateway's own keys: set OPENAI_API_KEY"
            " and/or ANTHROPIC_API_KEY in the gateway's environment"
        )


def _positive(name: str, value: float, *, zero: bool = False) -> None:
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        bound = ">= 0" if zero else "> 0"
        raise ConfigurationError(
            f"{name} must be a finite number of seconds {bound}, got {value!r}"
        )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``coalesce serve`` (every default ``None``: a flag not
    given leaves the setting to the environment, the file, then :data:`DEFAULTS`)."""
    parser = argparse.ArgumentParser(
        prog="coalesce serve",
        description="An OpenAI- and Anthropic-compatible gateway that coalesces the calls"
        " of every client into shared requests (see docs/gateway.md).",
        argument_default=None,
    )
    add = parser.add_argument
    add("--config", help="a JSON (or TOML on Python 3.11+) file of settings")
    add("--host", help=f"interface to bind (default {DEFAULTS['host']})")
    add("--port", type=int, help=f"port; 0 picks a free one (default {DEFAULTS['port']})")
    add("--openai-upstream", metavar="URL", help=f"default {DEFAULTS['openai_upstream']}")
    add("--anthropic-upstream", metavar="URL", help=f"default {DEFAULTS['anthropic_upstream']}")
    add("--budget", type=float, metavar="SECONDS", help="default latency budget of a call")
    add("--lane", choices=LANE_CHOICES, help="default lane of a call (default auto)")
    add("--max-items", type=int, help=f"most calls per request (default {DEFAULTS['max_items']})")
    add(
        "--max-wait",
        type=float,
        metavar="SECONDS",
        help="longest wait for company (default 0.05, or a quarter of --budget)",
    )
    add("--max-retries", type=int, help="retries of a failed upstream request (default 0)")
    add("--upstream-timeout", type=float, metavar="SECONDS", help="default 600")
    add("--max-body-size", type=int, metavar="BYTES", help="of a coalesced call (16 MiB)")
    add("--store", type=Path, metavar="PATH", help="the batch lane's job store")
    add("--batch-window", type=float, metavar="SECONDS", help="a batch job's wait (60)")
    add("--poll-interval", type=float, metavar="SECONDS", help="longest between polls (60)")
    add(
        "--api-key",
        dest="api_keys",
        action="append",
        metavar="KEY",
        help="a key clients must present (repeatable); the gateway then sends upstream with"
        " OPENAI_API_KEY / ANTHROPIC_API_KEY. Prefer COALESCE_API_KEYS: flags show in ps",
    )
    add("--graceful-timeout", type=float, metavar="SECONDS", help="default 30")
    add("--log-level", choices=_LOG_LEVELS, help="default info")
    return parser


def load_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """The settings of ``coalesce serve ARGV``: flags, then ``environ``, then the file.

    Args:
        argv: The arguments after ``coalesce serve``.
        environ: The environment (default ``os.environ``).

    Raises:
        ConfigurationError: A setting is out of range, of the wrong kind, or unknown
            in the file, or the file cannot be read.
    """
    env = os.environ if environ is None else environ
    args = vars(build_parser().parse_args(list(argv)))
    path = args.pop("config", None) or env.get(f"{ENV_PREFIX}CONFIG")
    from_file = _from_file(path)
    settings = {**from_file, **_from_env(env)}
    settings.update({name: value for name, value in args.items() if value is not None})
    if settings.get("api_keys"):
        settings.setdefault("openai_api_key", env.get("OPENAI_API_KEY"))
        settings.setdefault("anthropic_api_key", env.get("ANTHROPIC_API_KEY"))
    return _build(settings)


_KINDS: Mapping[str, Any] = {
    "port": int,
    "budget": float,
    "max_items": int,
    "max_wait": float,
    "max_retries": int,
    "upstream_timeout": float,
    "max_body_size": int,
    "graceful_timeout": float,
    "batch_window": float,
    "poll_interval": float,
    "store": Path,
}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in DEFAULTS:
        text = env.get(f"{ENV_PREFIX}{name.upper()}")
        if text is None or not text.strip():
            continue
        found[name] = (
            tuple(k.strip() for k in text.split(",") if k.strip()) if name == "api_keys" else text
        )
    return found


def _from_file(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith(".toml"):  # tomllib: Python 3.11+; on 3.10 the error says so
            data: Any = importlib.import_module("tomllib").loads(text)
        else:
            data = json.loads(text)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigurationError(f"cannot read the configuration file {path!r}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"the configuration file {path!r} must hold an object of settings")
    unknown = sorted(set(data) - set(DEFAULTS) - {"openai_api_key", "anthropic_api_key"})
    if unknown:
        raise ConfigurationError(
            f"unknown settings {unknown} in {path!r}; the settings are {', '.join(DEFAULTS)}"
        )
    return data


def _build(settings: Mapping[str, Any]) -> GatewayConfig:
    """A checked :class:`GatewayConfig` from settings of text or of their own kind."""
    values: dict[str, Any] = {}
    for name, value in settings.items():
        kind = _KINDS.get(name)
        if value is None or kind is None or isinstance(value, kind):
            values[name] = value
            continue
        try:
            values[name] = kind(value)
        except (TypeError, ValueError):
            noun = "a whole number" if kind is int else "a path" if kind is Path else "a number"
            raise ConfigurationError(f"{name} must be {noun}, got {value!r}") from None
    if "api_keys" in values:
        keys = values["api_keys"]
        values["api_keys"] = (keys,) if isinstance(keys, str) else tuple(keys)
    for name in (
        "budget", "max_wait", "upstream_timeout", "graceful_timeout", "batch_window",
        "poll_interval",
    ):  # fmt: skip
        if isinstance(values.get(name), int):
            values[name] = float(values[name])
    return GatewayConfig(**values)

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
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .._exceptions import ConfigurationError
from .._fleet.connection import FleetSettings, check_url, shown_url
from .._options import NOT_GIVEN, NotGiven, on, wait_for_company

__all__ = ["DEFAULTS", "ENV_PREFIX", "GatewayConfig", "build_parser", "load_config"]

#: The environment variables' prefix: ``COALESCE_BUDGET``, ``COALESCE_MAX_ITEMS``, ...
ENV_PREFIX = "COALESCE_"

#: Every setting's default, from the options model (:mod:`coalesce._options`).
DEFAULTS: Mapping[str, Any] = {option.setting: option.default_on("serve") for option in on("serve")}


@dataclass(frozen=True)
class GatewayConfig:
    """What one gateway runs with (see ``docs/gateway.md``): each setting is the
    ``serve`` option of that name in :data:`coalesce._options.OPTIONS` (``budget`` is
    ``latency_budget``), and ``store``, given, also makes the gateway finish at startup
    the jobs an earlier one left there with its own upstream key (``--api-key`` mode).

    Attributes:
        openai_api_key: The upstream OpenAI key of ``--api-key`` mode (the gateway then
            sends upstream with it, and checks the clients' keys against ``api_keys``).
        anthropic_api_key: The upstream Anthropic key of ``--api-key`` mode.
    """

    host: str = DEFAULTS["host"]
    port: int = DEFAULTS["port"]
    openai_upstream: str = DEFAULTS["openai_upstream"]
    anthropic_upstream: str = DEFAULTS["anthropic_upstream"]
    budget: float | None = DEFAULTS["budget"]
    lane: str = DEFAULTS["lane"]
    max_items: int | NotGiven = NOT_GIVEN
    max_wait: float | NotGiven = NOT_GIVEN
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
    fleet: str | None = field(default=DEFAULTS["fleet"], repr=False)  # may hold a password
    fleet_creds: Path | None = DEFAULTS["fleet_creds"]
    fleet_tls_ca: Path | None = DEFAULTS["fleet_tls_ca"]
    workers: int = DEFAULTS["workers"]

    def __post_init__(self) -> None:
        _check(self)

    @property
    def holds_keys(self) -> bool:
        """``--api-key`` mode: the gateway checks client keys and holds the upstream ones."""
        return bool(self.api_keys)

    @property
    def fleet_settings(self) -> FleetSettings | None:
        """Where this gateway joins its fleet (``None``: it coalesces alone)."""
        if self.fleet is None:
            return None
        return FleetSettings(self.fleet, self.fleet_creds, self.fleet_tls_ca)

    @property
    def lanes(self) -> dict[str, Any]:
        """``coalesce.wrap``'s lane keywords for these settings (``lane``, ``store``,
        ``batch_window``, ``poll_interval``)."""
        return {
            name: getattr(self, name) for name in ("lane", "store", "batch_window", "poll_interval")
        }

    def describe(self) -> str:
        """One line of the settings, secrets left out (the startup log line)."""
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        shown["max_wait"] = wait_for_company(self.max_wait, self.budget)  # what it is
        shown["max_items"] = "learned" if self.max_items is NOT_GIVEN else self.max_items
        shown["api_key_mode"] = self.holds_keys
        shown["fleet"] = None if self.fleet is None else shown_url(self.fleet)
        return " ".join(f"{name}={value}" for name, value in shown.items())


def _check(config: GatewayConfig) -> None:
    """Refuse a setting out of range, naming it, its value and what is valid."""
    for option in on("serve"):
        value = getattr(config, option.setting)
        if value is not None:
            option.validate(value, option.setting, optional=False)
    if not 0 <= config.port <= 65535:
        raise ConfigurationError(f"port must be from 0 to 65535 (0: a free one), got {config.port}")
    for name in ("openai_upstream", "anthropic_upstream"):
        url = getattr(config, name)
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"{name} must be an http:// or https:// URL, got {url!r}")
    if any(not key.strip() for key in config.api_keys):
        raise ConfigurationError("api_keys: a client key is empty; give non-empty keys")
    if config.fleet is not None:
        check_url(config.fleet)
    if config.holds_keys and not (config.openai_api_key or config.anthropic_api_key):
        raise ConfigurationError(
            "--api-key mode sends upstream with the gateway's own keys: set OPENAI_API_KEY"
            " and/or ANTHROPIC_API_KEY in the gateway's environment"
        )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``coalesce serve``: a flag per ``serve`` option (every
    default ``None``: a flag not given leaves the setting to the environment, the file,
    then :data:`DEFAULTS`)."""
    parser = argparse.ArgumentParser(
        prog="coalesce serve",
        description="An OpenAI- and Anthropic-compatible gateway that coalesces the calls"
        " of every client into shared requests (see docs/gateway.md).",
        argument_default=None,
    )
    parser.add_argument("--config", help="a JSON (or TOML on Python 3.11+) file of settings")
    for option in on("serve"):
        default = option.default_on("serve")
        shown = "" if default in (None, (), NOT_GIVEN) else f" (default {default})"
        parser.add_argument(
            option.flag,
            dest=option.setting,
            type=option.kind,
            action="append" if option.setting == "api_keys" else "store",
            help=option.meaning + shown,
        )
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


#: How each setting is read from text (a flag, a variable, a file's value).
_KINDS: Mapping[str, Any] = {option.setting: option.kind for option in on("serve")}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for option in on("serve"):
        text = env.get(option.variable, "")
        if text.strip():
            keys = option.setting == "api_keys"
            found[option.setting] = (
                tuple(filter(None, map(str.strip, text.split(",")))) if keys else text
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
        if name == "api_keys":
            values[name] = (value,) if isinstance(value, str) else tuple(value)
        elif value is None or kind is None or isinstance(value, kind):
            values[name] = value
        else:
            try:
                values[name] = kind(value)
            except (TypeError, ValueError):
                noun = "a whole number" if kind is int else "a path" if kind is Path else "a number"
                raise ConfigurationError(f"{name} must be {noun}, got {value!r}") from None
    return GatewayConfig(**values)

"""Configuration files: JSON always, TOML on Python 3.11+ (``tomllib``)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from coalesce.exceptions import ConfigurationError

from ._batches import BatchTiming
from ._cache import SimulatedPromptCache
from ._degradation import PackingDegradation
from ._faults import FaultPlan
from ._flex import FlexProcessing
from ._latency import LatencyProfile, SimulatedLatency
from ._length import LongTail
from ._ratelimit import RateLimit, RateLimits

__all__ = ["load_config", "provider_options"]

_TOP_KEYS = {
    "time_scale",
    "seed",
    "latency",
    "rate_limits",
    "faults",
    "output_tokens",
    "batches",
    "context_window",
    "output_limit",
    "prompt_cache",
    "flex",
    "enqueued_token_limit",
    "degradation",
}


def load_config(path: str | PathLike[str]) -> dict[str, Any]:
    """Read a configuration file (``.toml`` as TOML, anything else as JSON).

    Raises:
        ConfigurationError: It cannot be read or parsed.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
        if file.suffix == ".toml":
            value: Any = _toml().loads(text)
        else:
            value = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the simulator configuration {file}: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigurationError(f"the simulator configuration {file} must hold an object")
    return value


def _toml() -> Any:
    try:
        return importlib.import_module("tomllib")
    except ImportError:
        raise ConfigurationError("TOML configuration needs Python 3.11+; use JSON") from None


def _build(kind: Any, section: Any, name: str) -> Any:
    if not isinstance(section, Mapping):
        raise ConfigurationError(f"'{name}' must be an object, got {section!r}")
    try:
        return kind(**section)
    except TypeError as exc:
        raise ConfigurationError(f"invalid keys in '{name}': {exc}") from None


def _latency(section: Any) -> SimulatedLatency:
    if not isinstance(section, Mapping):
        raise ConfigurationError(f"'latency' must be an object, got {section!r}")
    models = section.get("models", {})
    return SimulatedLatency(
        default=_build(LatencyProfile, section.get("default", {}), "latency.default"),
        models={n: _build(LatencyProfile, p, f"latency.models.{n}") for n, p in models.items()},
        jitter=float(section.get("jitter", 0.0)),
    )


def _rate_limits(section: Any) -> RateLimits:
    if not isinstance(section, Mapping):
        raise ConfigurationError(f"'rate_limits' must be an object, got {section!r}")
    keys = section.get("keys", {})
    default = {k: v for k, v in section.items() if k != "keys"}
    return RateLimits(
        default=_build(RateLimit, default, "rate_limits"),
        keys={k: _build(RateLimit, v, f"rate_limits.keys.{k}") for k, v in keys.items()},
    )


def _output_tokens(section: Any) -> Any:
    if section is None or isinstance(section, int):
        return section
    if isinstance(section, Mapping) and "long_tail" in section:
        return _build(LongTail, section["long_tail"], "output_tokens.long_tail")
    raise ConfigurationError(
        f"'output_tokens' must be a number or {{\"long_tail\": {{...}}}}, got {section!r}"
    )


def provider_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the keyword arguments of :class:`SimulatedProvider` for a parsed configuration.

    Raises:
        ConfigurationError: A key or value is invalid.
    """
    unknown = set(config) - _TOP_KEYS
    if unknown:
        raise ConfigurationError(
            f"unknown simulator configuration keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}"
        )
    options: dict[str, Any] = {
        "time_scale": float(config.get("time_scale", 1.0)),
        "seed": int(config.get("seed", 0)),
        "output_tokens": _output_tokens(config.get("output_tokens")),
    }
    for key, read in _SECTIONS.items():
        if key in config:
            options[key] = read(config[key])
    return options


def _prompt_cache(section: Any) -> SimulatedPromptCache | bool:
    if isinstance(section, bool):
        return section
    return _build(SimulatedPromptCache, section, "prompt_cache")  # type: ignore[no-any-return]


def _given(section: Any) -> Any:
    return section  # checked by the provider itself


def _object(kind: Any, name: str) -> Callable[[Any], Any]:
    return lambda section: _build(kind, section, name)


#: The optional sections, each with how it is read, in the order they are checked.
_SECTIONS: Mapping[str, Callable[[Any], Any]] = {
    "latency": _latency,
    "rate_limits": _rate_limits,
    "faults": _object(FaultPlan, "faults"),
    "context_window": _given,
    "output_limit": _given,
    "batches": _object(BatchTiming, "batches"),
    "flex": _object(FlexProcessing, "flex"),
    "enqueued_token_limit": _given,
    "degradation": _object(PackingDegradation, "degradation"),
    "prompt_cache": _prompt_cache,
}

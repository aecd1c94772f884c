"""Option checks shared by every public entry point.

Each raises :class:`~coalesce.ConfigurationError` naming the option, the value it
got and the range it accepts, at decoration time rather than on the first call.
"""

from __future__ import annotations

import math
from typing import Any

from ._exceptions import ConfigurationError

__all__ = ["check_callable", "check_int", "check_seconds"]


def check_int(name: str, value: Any, *, minimum: int = 1, optional: bool = False) -> int | None:
    """An integer option ``>= minimum`` (``None`` allowed when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = f"an integer >= {minimum}" + (" or None" if optional else "")
        raise ConfigurationError(f"{name} must be {allowed}, got {value!r}")
    return value


def check_seconds(
    name: str, value: Any, *, positive: bool = False, optional: bool = False, unit: str = "seconds"
) -> float | None:
    """A finite number of ``unit``, ``>= 0`` (``> 0`` when ``positive``)."""
    if value is None and optional:
        return None
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )
    if not ok:
        bound = "> 0" if positive else ">= 0"
        allowed = f"a finite number of {unit} {bound}" + (" or None" if optional else "")
        raise ConfigurationError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


def check_callable(name: str, value: Any) -> Any:
    """A callable option, or ``None``."""
    if value is not None and not callable(value):
        raise ConfigurationError(f"{name} must be a callable or None, got {value!r}")
    return value

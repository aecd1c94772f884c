"""Checks shared by every public entry point.

The option checks raise :class:`~coalesce.ConfigurationError` naming the option, the
value it got and the range it accepts, at decoration time rather than on the first
call; :func:`jsonable` raises :class:`~coalesce.InvalidInputError` for one call's item
that cannot be sent, naming where in the item the problem is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pydantic_core

from ._exceptions import ConfigurationError, InvalidInputError

__all__ = ["check_callable", "check_int", "check_seconds", "jsonable"]

_BINARY = (bytes, bytearray, memoryview)
# How deep the search for the offending part of an item goes (it also stops cycles).
_MAX_DEPTH = 32


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


def jsonable(value: Any, *, field: str, subject: str) -> Any:
    """``value`` as JSON data (pydantic's conversion: models, dataclasses, dates...).

    Binary data is refused anywhere in plain lists and dicts, even when it would decode
    as UTF-8: a prompt carries text, and pydantic would otherwise decode some bytes and
    fail on others.

    Args:
        value: One call's item, or one of its fields.
        field: Where ``value`` sits in the item (``"$"``, ``"$.text"``).
        subject: What ``value`` is, for the message (``"tag: argument 'text'"``).

    Raises:
        InvalidInputError: Naming the part that cannot be sent, its type and the fix;
            its ``field`` says where the part is.
    """
    binary = _find(value, field, _is_binary, 0)
    if binary is not None:
        raise _refused(subject, field, *binary)
    try:
        return pydantic_core.to_jsonable_python(value)
    except (TypeError, ValueError) as exc:
        culprit = _find(value, field, _not_jsonable, 0) or (field, value)
        raise _refused(subject, field, *culprit) from exc


def _is_binary(value: Any) -> bool:
    return isinstance(value, _BINARY)


def _not_jsonable(value: Any) -> bool:
    try:
        pydantic_core.to_jsonable_python(value)
    except (TypeError, ValueError):
        return True
    return False


def _find(value: Any, path: str, bad: Callable[[Any], bool], depth: int) -> tuple[str, Any] | None:
    """The path and value of the first part of ``value`` that is ``bad``, if any."""
    if depth < _MAX_DEPTH and isinstance(value, Mapping):
        parts: Any = ((f"{path}.{key}", sub) for key, sub in value.items())
    elif depth < _MAX_DEPTH and isinstance(value, (list, tuple)):
        parts = ((f"{path}[{index}]", sub) for index, sub in enumerate(value))
    else:
        return (path, value) if bad(value) else None
    for where, sub in parts:
        found = _find(sub, where, bad, depth + 1)
        if found is not None:
            return found
    return None


def _refused(subject: str, field: str, path: str, value: Any) -> InvalidInputError:
    where = "" if path == field else f" at {path}"
    kind = type(value).__name__
    if isinstance(value, _BINARY):
        fix = "decode it to str (value.decode()) or encode binary data as base64 text"
        return InvalidInputError(
            f"{subject}{where} is {kind}, which a prompt cannot carry: {fix}", field=path
        )
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return InvalidInputError(
        f"{subject}{where} is of type {kind} ({shown}), which cannot be sent as JSON: pass str,"
        " numbers, bools, None, lists, dicts, dataclasses or pydantic models",
        field=path,
    )

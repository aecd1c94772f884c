"""Checks shared by every public entry point.

The option checks raise :class:`~coalesce.ConfigurationError` naming the option, the
value it got and the range it accepts, at decoration time rather than on the first
call; :func:`partition_of` names a partition function that fails one call.

One call's item is checked in two steps, each raising
:class:`~coalesce.InvalidInputError` for that call alone and naming where in the item
the problem is, as a JSON path (``$.tags[2]``, ``$["a b"]``: :func:`json_path`):

* :func:`jsonable` turns the caller's arguments into JSON data (pydantic's
  conversion: models, dataclasses, dates...), refusing binary data and objects it
  cannot convert;
* :func:`encode_item` writes that data as canonical JSON, refusing what strict JSON
  cannot carry: NaN or infinity, a lone surrogate, which UTF-8 cannot encode, a key
  that is not a string or a number, a circular reference, any other object.

Both search the item for the offending part with one walk (:func:`_search`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core

from ._exceptions import ConfigurationError, InvalidInputError

__all__ = [
    "check_callable",
    "check_int",
    "check_item",
    "check_seconds",
    "encode_item",
    "json_path",
    "jsonable",
    "partition_of",
]

_BINARY = (bytes, bytearray, memoryview)
# How deep the search for the part pydantic cannot convert goes.
_MAX_DEPTH = 32

_VALID = (
    "valid items hold only objects with string keys, arrays, strings, finite numbers,"
    " true, false and null"
)

Found = tuple[str, Any]
"""Where in an item a problem is (its JSON path), and what: the part, or a description."""


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


def partition_of(
    partition: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    receives: str,
) -> Hashable:
    """What the user's ``partition`` function says of one call: a hashable key.

    Args:
        partition: The ``partition=`` option.
        args: Its positional arguments for this call.
        kwargs: Its keyword arguments for this call.
        receives: What those are, for the message (``"the call's arguments"``).

    Raises:
        ConfigurationError: ``partition`` raised (the cause), or returned a value that
            is not hashable; only this call fails.
    """
    name = getattr(partition, "__qualname__", repr(partition))
    try:
        key = partition(*args, **(kwargs or {}))
    except Exception as exc:
        raise ConfigurationError(
            f"the partition function {name} raised {exc!r} for this call; it receives"
            f" {receives} and must return a hashable key (a str, an int or a tuple of them)"
        ) from exc
    try:
        hash(key)
    except TypeError as exc:
        raise ConfigurationError(
            f"the partition function {name} returned {key!r}, which is not hashable; return"
            " a str, an int or a tuple of them"
        ) from exc
    return key  # type: ignore[no-any-return]


def json_path(path: str, key: Any) -> str:
    """The JSON path of ``key`` under ``path``: ``$.text``, or ``$["a b"]`` (ASCII-escaped).

    Args:
        path: The path of the object holding ``key`` (``"$"`` for the item itself).
        key: A key of that object (not necessarily a string).
    """
    name = str(key)
    if name.isidentifier() and name.isascii():
        return f"{path}.{name}"
    return f"{path}[{json.dumps(name)}]"


# -- the one walk -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Rules:
    """What one search of an item refuses.

    Attributes:
        leaf: The problem of a part that is not searched further (not a container, or
            one at ``max_depth``), or ``None``.
        circular: The problem of a container met again inside itself.
        mappings: The mapping types searched (others are leaves).
        key: The problem of one key of a mapping, asked before its values.
        keys: The problem of a mapping's keys together, asked after its values.
        max_depth: How deep containers are searched (``None``: no limit).
    """

    leaf: Callable[[Any, str], Found | None]
    circular: Callable[[Any, str], Found | None]
    mappings: type | tuple[type, ...] = Mapping
    key: Callable[[Any, str], Found | None] | None = None
    keys: Callable[[Any, str], Found | None] | None = None
    max_depth: int | None = None


def _search(value: Any, path: str, rules: _Rules, active: set[int], depth: int = 0) -> Found | None:
    """The first problem (depth first, in the item's order) under ``value`` at ``path``."""
    mapping = isinstance(value, rules.mappings)
    deep = rules.max_depth is not None and depth >= rules.max_depth
    if deep or not (mapping or isinstance(value, (list, tuple))):
        return rules.leaf(value, path)
    if id(value) in active:
        return rules.circular(value, path)
    active.add(id(value))
    try:
        if mapping:
            return _search_mapping(value, path, rules, active, depth)
        parts = ((f"{path}[{index}]", part) for index, part in enumerate(value))
        return _first(parts, rules, active, depth)
    finally:
        active.discard(id(value))


def _search_mapping(
    value: Any, path: str, rules: _Rules, active: set[int], depth: int
) -> Found | None:
    if rules.key is not None:
        for key in value:
            found = rules.key(key, path)
            if found is not None:
                return found
    parts = ((json_path(path, key), part) for key, part in value.items())
    found = _first(parts, rules, active, depth)
    if found is None and rules.keys is not None:
        return rules.keys(value, path)
    return found


def _first(
    parts: Iterable[tuple[str, Any]], rules: _Rules, active: set[int], depth: int
) -> Found | None:
    for path, part in parts:
        found = _search(part, path, rules, active, depth + 1)
        if found is not None:
            return found
    return None


# -- step 1: the caller's arguments as JSON data ------------------------------------------


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
    binary = _search(value, field, _BINARY_PARTS, set())
    if binary is not None:
        raise _refused(subject, field, *binary)
    try:
        return pydantic_core.to_jsonable_python(value)
    except (TypeError, ValueError) as exc:
        culprit = _search(value, field, _UNCONVERTIBLE_PARTS, set()) or (field, value)
        raise _refused(subject, field, *culprit) from exc


def _when(bad: Callable[[Any], bool]) -> Callable[[Any, str], Found | None]:
    """A leaf rule: the part itself, where ``bad`` says so."""

    def leaf(value: Any, path: str) -> Found | None:
        return (path, value) if bad(value) else None

    return leaf


def _is_binary(value: Any) -> bool:
    return isinstance(value, _BINARY)


def _not_jsonable(value: Any) -> bool:
    try:
        pydantic_core.to_jsonable_python(value)
    except (TypeError, ValueError):
        return True
    return False


# A container met again inside itself is judged whole, as one at the depth limit is.
_BINARY_PARTS = _Rules(_when(_is_binary), _when(_is_binary), max_depth=_MAX_DEPTH)
_UNCONVERTIBLE_PARTS = _Rules(_when(_not_jsonable), _when(_not_jsonable), max_depth=_MAX_DEPTH)


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


# -- step 2: JSON data as strict, canonical JSON -------------------------------------------


def check_item(item: Any) -> None:
    """Refuse an item that cannot be sent as strict JSON.

    Args:
        item: The call's input, already converted to JSON-able Python data.

    Raises:
        InvalidInputError: If it holds NaN or infinity, a lone surrogate (in a string or
            a key), or a value of a non-JSON type; ``field`` is its JSON path.
    """
    encode_item(item)


def encode_item(item: Any) -> tuple[str, int]:
    """The item's canonical JSON (sorted keys, compact) and its size in UTF-8 bytes.

    Args:
        item: The call's input, already converted to JSON-able Python data.

    Raises:
        InvalidInputError: As :func:`check_item`.
    """
    try:
        text = json.dumps(
            item, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        return text, len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError too
        raise _refusal(item, exc) from None


def _refusal(item: Any, cause: BaseException) -> InvalidInputError:
    """The error naming the first field of ``item`` that JSON cannot carry."""
    try:
        found = _search(item, "$", _STRICT, set())
    except RecursionError:
        found = ("$", "is nested too deeply to be written as JSON; flatten it")
    if found is None:
        reason = str(cause).encode("utf-8", "backslashreplace").decode("utf-8")
        return InvalidInputError(
            f"the item cannot be written as JSON ({reason}); {_VALID}", field="$"
        )
    path, problem = found
    return InvalidInputError(f"the item cannot be sent: {path} {problem}", field=path)


def _strict_leaf(value: Any, path: str) -> Found | None:
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, _not_finite(value))
    if isinstance(value, str):
        return _lone_surrogate(value, path, "holds")
    kind = type(value).__name__
    return path, f"is {_article(kind)} {kind}, which is not JSON; convert it first ({_VALID})"


def _circular(value: Any, path: str) -> Found:
    return path, "contains itself (a circular reference), which JSON cannot write"


def _key_problem(key: Any, path: str) -> Found | None:
    if isinstance(key, str):
        return _lone_surrogate(key, json_path(path, key), "has a key that holds")
    if isinstance(key, float) and not math.isfinite(key):
        return path, f"has the key {key!r}; JSON keys are strings"
    if key is None or isinstance(key, (bool, int, float)):
        return None
    kind = type(key).__name__
    return path, f"has {_article(kind)} {kind} key, which JSON cannot write; use string keys"


def _unsortable_keys(value: Any, path: str) -> Found | None:
    try:
        sorted(value)  # the canonical form sorts the keys
    except TypeError:
        kinds = sorted({type(key).__name__ for key in value})
        return path, f"has keys of mixed types ({', '.join(kinds)}); use string keys"
    return None


_STRICT = _Rules(_strict_leaf, _circular, dict, _key_problem, _unsortable_keys)


def _lone_surrogate(text: str, path: str, verb: str) -> Found | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        return path, (
            f"{verb} a lone surrogate {char!a} at index {exc.start}, which UTF-8 cannot"
            " encode; remove it, or decode the source text with errors='replace'"
        )
    return None


def _not_finite(value: float) -> str:
    return f"is {value!r}, which JSON cannot represent; use a finite number or None"


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"

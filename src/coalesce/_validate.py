"""Checks shared by every public entry point.

Option checks raise :class:`~coalesce.ConfigurationError` at decoration time. One
call's item is checked in two steps, :func:`jsonable` (to JSON data) then
:func:`encode_item` (to strict, canonical JSON), each raising
:class:`~coalesce.InvalidInputError` for that call alone, naming where in the item the
problem is as a JSON path (``$.tags[2]``, ``$["a b"]``), found by one walk
(:func:`_search`).
"""

from __future__ import annotations

import difflib
import inspect
import json
import math
import os
import sys
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core

from ._exceptions import ConfigurationError, InvalidInputError

__all__ = [
    "ArgumentTypes",
    "bind_arguments",
    "check_callable",
    "check_int",
    "check_item",
    "check_seconds",
    "encode_item",
    "json_path",
    "jsonable",
    "partition_of",
    "warn_caller",
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
    """What the user's ``partition`` function says of one call (its ``args`` and
    ``kwargs``, which ``receives`` names for the message): a hashable key.

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


# -- a call's arguments against its function ---------------------------------------------


def bind_arguments(
    signature: inspect.Signature,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    name: str,
    shown: inspect.Signature | None = None,
) -> inspect.BoundArguments:
    """``args`` (``self`` first, on a method) and ``kwargs`` bound to ``signature``, its
    defaults applied; ``shown`` is the signature callers see (without ``self``).

    Raises:
        TypeError: The arguments do not fit: the message names the function, each
            unexpected keyword (and the parameter it may misspell), what is missing,
            and how to call it.
    """
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        problems = _misfits(signature, args, kwargs) or [str(exc)]
        call = f"{name.rsplit('.', 1)[-1]}{_plain(shown or signature)}"
        raise TypeError(
            f"{name}() got arguments that do not fit it: {'; '.join(problems)}; call it as {call}"
        ) from None
    bound.apply_defaults()
    return bound


def _misfits(
    signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> list[str]:
    """What is wrong with a call that does not bind: unexpected keywords, then what
    Python says of the rest (a missing argument, too many positional ones...)."""
    parameters = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        unexpected: list[str] = []
    else:
        unexpected = [key for key in kwargs if key not in parameters]
    names = [
        n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    problems = [
        f"an unexpected keyword argument {key!r}{_did_you_mean(key, names)}" for key in unexpected
    ]
    try:
        signature.bind(*args, **{k: v for k, v in kwargs.items() if k not in unexpected})
    except TypeError as rest:
        problems.append(str(rest))
    return problems


def _did_you_mean(key: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _plain(signature: inspect.Signature) -> str:
    """``(ticket, lang='en')``: the signature without annotations, as a call reads."""
    empty = inspect.Parameter.empty
    parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=empty))


class ArgumentTypes:
    """Each annotated parameter's pydantic validator, run on every call before it is sent.

    Validation is pydantic's lax mode (``"42"`` passes for an ``int``; ``42`` and
    ``None`` do not pass for a ``str``) and only checks: the item is made from the
    values as the caller passed them. A parameter without an annotation, annotated
    ``Any``, or of a type pydantic cannot validate, is not checked.
    """

    def __init__(
        self, signature: inspect.Signature, hints: Mapping[str, Any], *, name: str
    ) -> None:
        """``hints``: the resolved annotations (``typing.get_type_hints``)."""
        self.name = name
        self._checks: dict[str, tuple[Any, pydantic.TypeAdapter[Any]]] = {}
        for parameter in signature.parameters.values():
            hint = hints.get(parameter.name, Any)
            if hint is Any:
                continue
            if parameter.kind is parameter.VAR_POSITIONAL:
                hint = tuple[hint, ...]  # type: ignore[valid-type]
            elif parameter.kind is parameter.VAR_KEYWORD:
                hint = dict[str, hint]  # type: ignore[valid-type]
            adapter = _adapter(hint)
            if adapter is not None:
                self._checks[parameter.name] = (hint, adapter)

    def check(self, arguments: Mapping[str, Any], field: Callable[[str], str]) -> None:
        """Validate each bound argument against its parameter's annotation; ``field``
        gives the JSON path of a parameter's value in the item (``"$"``, ``"$.text"``).

        Raises:
            InvalidInputError: An argument does not validate: naming the function, the
                parameter, its type, the value and pydantic's reason; ``field`` is where.
        """
        for name, value in arguments.items():
            if name not in self._checks:
                continue
            hint, adapter = self._checks[name]
            try:
                adapter.validate_python(value)
            except pydantic.ValidationError as exc:
                raise self._refused(name, hint, exc, field(name)) from exc

    def _refused(
        self, name: str, hint: Any, error: pydantic.ValidationError, field: str
    ) -> InvalidInputError:
        first = error.errors()[0]
        path = field
        for part in first["loc"]:
            path = f"{path}[{part}]" if isinstance(part, int) else json_path(path, part)
        where = "" if path == field else f" (at {path})"
        more = error.error_count() - 1
        also = f" (and {more} more problem{'s' * (more > 1)})" if more else ""
        return InvalidInputError(
            f"{self.name}: argument {name!r} must be {_type_name(hint)}{where}: {first['msg']},"
            f" got {_short(first['input'])} ({type(first['input']).__name__}){also};"
            " nothing was sent",
            field=path,
        )


def _adapter(hint: Any) -> pydantic.TypeAdapter[Any] | None:
    """A validator for ``hint``: pydantic's, else an ``isinstance`` check for a plain
    class, else ``None`` (not checked)."""
    try:
        return pydantic.TypeAdapter(hint)
    except Exception:  # a type pydantic has no schema for
        pass
    try:
        config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        return pydantic.TypeAdapter(hint, config=config)
    except Exception:
        return None


def _type_name(hint: Any) -> str:
    if isinstance(hint, type) and not getattr(hint, "__args__", None):
        return hint.__qualname__
    return repr(hint).replace("typing.", "")


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


# -- warnings aimed at the user's line ----------------------------------------------------

# Packages whose frames are not the caller's: coalesce itself, and the event loops that
# run it (a warning raised in a task has the loop's frames below it, not the user's).
_NOT_THE_CALLER = ("coalesce", "anyio", "asyncio", "trio")


def warn_caller(message: str, category: type[Warning]) -> None:
    """Warn, pointing at the first frame outside coalesce and the event loop running it
    (what Python 3.12's ``skip_file_prefixes`` does, on 3.10 too)."""
    warnings.warn(message, category, stacklevel=_outside_stacklevel())


def _outside_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warn_caller`'s ``warnings.warn`` that names its first
    caller outside ``_NOT_THE_CALLER``."""
    files = (getattr(sys.modules.get(name), "__file__", None) for name in _NOT_THE_CALLER)
    dirs = tuple(os.path.dirname(os.path.abspath(file)) + os.sep for file in files if file)
    frame, level = sys._getframe(2), 2  # warn_caller's caller, as stacklevel=2 names it
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(dirs):
        frame, level = frame.f_back, level + 1
    return level


def json_path(path: str, key: Any) -> str:
    """The JSON path of ``key`` (not necessarily a string) under ``path`` (``"$"``: the
    item): ``$.text``, or ``$["a b"]`` (ASCII-escaped)."""
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
    fail on others. So are dict keys JSON cannot write faithfully: a tuple or frozenset
    key (pydantic would write ``(1, 2)`` as ``"1,2"``), a binary or non-finite one, and
    keys that JSON would write as one (``1`` and ``"1"``). Other keys are written as JSON
    writes them: ``{1: "a", "b": 2}`` as ``{"1": "a", "b": 2}``.

    Args:
        value: One call's item, or one of its fields.
        field: Where ``value`` sits in the item (``"$"``, ``"$.text"``).
        subject: What ``value`` is, for the message (``"tag: argument 'text'"``).

    Raises:
        InvalidInputError: Naming the part that cannot be sent, its type and the fix;
            its ``field`` says where the part is.
    """
    if type(value) is str:
        return value  # text: nothing to refuse or convert
    binary = _search(value, field, _BINARY_PARTS, set())
    if binary is not None:
        raise _refused(subject, field, *binary)
    keys = _search(value, field, _KEY_PARTS, set())
    if keys is not None:
        path, problem = keys
        where = "" if path == field else f" at {path}"
        raise InvalidInputError(f"{subject}{where} {problem}", field=path)
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


def _unwritable_key(key: Any, path: str) -> Found | None:
    """A key JSON cannot write as itself: a container, binary data, NaN or infinity."""
    kind = type(key).__name__
    if isinstance(key, (tuple, frozenset)):
        text = _key_text(key)
        becomes = "" if text is None else f", and this one would arrive as {json.dumps(text)}"
        return path, (
            f"has the {kind} key {_short(key)}, which JSON cannot write faithfully (an"
            f" object's keys are strings{becomes}); use string keys, or a list of pairs"
        )
    if isinstance(key, _BINARY):
        return (
            path,
            f"has {_article(kind)} {kind} key, which a prompt cannot carry; decode it to str",
        )
    if isinstance(key, float) and not math.isfinite(key):
        return path, f"has the key {key!r}, which JSON cannot write; use a string key"
    return None


def _colliding_keys(value: Any, path: str) -> Found | None:
    """Two keys JSON would write as one (``1`` and ``"1"``): one value would be lost."""
    if all(type(key) is str for key in value):
        return None
    seen: dict[str, Any] = {}
    for key in value:
        text = _key_text(key)
        if text is None:
            continue
        if text in seen:
            return path, (
                f"has the keys {_short(seen[text])} and {_short(key)}, which JSON writes as"
                f" one key {json.dumps(text)}, losing a value; make them distinct strings"
            )
        seen[text] = key
    return None


def _key_text(key: Any) -> str | None:
    """The string pydantic writes for ``key`` as an object's key, or ``None`` if none."""
    try:
        converted = pydantic_core.to_jsonable_python({key: None})
    except (TypeError, ValueError):
        return None
    return next(iter(converted), None) if isinstance(converted, dict) else None


def _nothing(value: Any, path: str) -> Found | None:
    return None


# A container met again inside itself is judged whole, as one at the depth limit is.
_BINARY_PARTS = _Rules(_when(_is_binary), _when(_is_binary), max_depth=_MAX_DEPTH)
_UNCONVERTIBLE_PARTS = _Rules(_when(_not_jsonable), _when(_not_jsonable), max_depth=_MAX_DEPTH)
_KEY_PARTS = _Rules(
    _nothing, _nothing, key=_unwritable_key, keys=_colliding_keys, max_depth=_MAX_DEPTH
)


def _refused(subject: str, field: str, path: str, value: Any) -> InvalidInputError:
    where = "" if path == field else f" at {path}"
    kind = type(value).__name__
    if isinstance(value, _BINARY):
        fix = "decode it to str (value.decode()) or encode binary data as base64 text"
        return InvalidInputError(
            f"{subject}{where} is {kind}, which a prompt cannot carry: {fix}", field=path
        )
    return InvalidInputError(
        f"{subject}{where} is of type {kind} ({_short(value)}), which cannot be sent as JSON: pass str,"
        " numbers, bools, None, lists, dicts, dataclasses or pydantic models",
        field=path,
    )


# -- step 2: JSON data as strict, canonical JSON -------------------------------------------


def check_item(item: Any) -> None:
    """Refuse an item (JSON-able Python data) that cannot be sent as strict JSON.

    Raises:
        InvalidInputError: If it holds NaN or infinity, a lone surrogate (in a string or
            a key), or a value of a non-JSON type; ``field`` is its JSON path.
    """
    encode_item(item)


#: The canonical JSON of an item, as ``json.dumps`` with these options writes it (one
#: encoder for every call, rather than one made by each ``json.dumps``).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False
)


def encode_item(item: Any) -> tuple[str, int]:
    """The item's canonical JSON (sorted keys, compact) and its size in UTF-8 bytes.

    Raises:
        InvalidInputError: As :func:`check_item`.
    """
    try:
        text = _CANONICAL.encode(item)
        return text, len(text) if text.isascii() else len(text.encode("utf-8"))
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

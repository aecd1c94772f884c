"""``wrap(partition=...)``: which calls may share a prompt.

The rule on every entry point: ``partition`` is called with the call's own arguments
as the caller passed them, so for ``wrap`` ``partition(**kwargs)`` (``@batch``:
``partition(item)``; ``@prompt``: ``partition(*args, **kwargs)``). The older form
``partition(kwargs)``, one read-only mapping, still works, with a
``DeprecationWarning`` from ``wrap()``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .._validate import check_callable, partition_of, warn_caller
from .call import given_arguments

__all__ = ["Partition", "PartitionFunction", "partition_function", "partition_key"]

#: ``partition(**kwargs) -> key``: calls with different keys never share a prompt.
Partition = Callable[..., Hashable]


def _takes_one_mapping(function: Callable[..., Any]) -> bool:
    """Whether ``function`` has the old form ``partition(kwargs)``: no ``**kwargs``
    parameter and exactly one positional one (a signature that cannot be read counts
    as the old form, which is how it was called so far)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return True
    kinds = [p.kind for p in parameters]
    if inspect.Parameter.VAR_KEYWORD in kinds:
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = sum(kind in positional for kind in kinds)
    return named == 1 or (named == 0 and inspect.Parameter.VAR_POSITIONAL in kinds)


@dataclass(frozen=True)
class PartitionFunction:
    """The client's ``partition=`` function and how to call it.

    Attributes:
        function: The caller's function.
        legacy: Called the old way, ``function(kwargs)`` with one read-only mapping,
            rather than ``function(**kwargs)``.
    """

    function: Partition
    legacy: bool = False

    @classmethod
    def of(cls, function: Partition) -> PartitionFunction:
        """``function`` (``wrap()``'s ``partition=``), its form read from its signature;
        the old form warns, pointing at the first caller outside coalesce."""
        legacy = _takes_one_mapping(function)
        if legacy:
            name = _name(function)
            warn_caller(
                f"wrap(partition={name}): a partition function of one mapping,"
                " partition(kwargs), is deprecated; partition is called with the call's own"
                " keyword arguments, partition(**kwargs), as @coalesce.prompt calls it with"
                f" the function's arguments. Write {name} as `def {name}(**kwargs)` (or"
                " `lambda **kwargs: ...`); until then it is called the old way",
                DeprecationWarning,
            )
        return cls(function, legacy)

    def arguments(self, given: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """(args, kwargs) of the function for a call whose given arguments are ``given``."""
        if self.legacy:
            return (MappingProxyType(dict(given)),), {}
        return (), dict(given)

    @property
    def receives(self) -> str:
        """What the function receives, for error messages."""
        if self.legacy:
            return "the call's keyword arguments as one read-only mapping"
        return "the call's keyword arguments, as partition(**kwargs),"


def partition_function(partition: Partition | None) -> PartitionFunction | None:
    """``wrap()``'s ``partition=``, checked: ``None``, or the function and its form.

    The old form warns, pointing at the caller of ``wrap()``.

    Raises:
        ConfigurationError: ``partition`` is neither callable nor ``None``.
    """
    check_callable("partition", partition)
    return None if partition is None else PartitionFunction.of(partition)


def _name(function: Callable[..., Any]) -> str:
    return str(getattr(function, "__qualname__", repr(function)))


def partition_key(
    partition: PartitionFunction | None, kwargs: Mapping[str, Any], header: str | None
) -> Hashable:
    """The batcher's partition of one call: its ``x-coalesce-partition`` header and
    what ``partition`` says of its keyword arguments (``None``: the shared partition).

    Args:
        partition: The client's partition function, if any.
        kwargs: The call's keyword arguments, as the caller gave them (the SDK's "not
            given" sentinels are left out).
        header: The call's ``x-coalesce-partition`` header, if any.

    Raises:
        ConfigurationError: ``partition`` raised, or returned an unhashable value.
    """
    if partition is None:
        return None if header is None else (header, None)
    args, kw = partition.arguments(given_arguments(kwargs))
    return (header, partition_of(partition.function, args, kw, receives=partition.receives))

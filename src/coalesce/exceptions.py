"""The exceptions coalesce raises, on their own: ``from coalesce.exceptions import ...``.

The same classes as ``coalesce.CoalesceError`` and its subclasses at the top level
(the tree is drawn in ``coalesce._exceptions``). Code that stands apart from the rest of
coalesce takes them from here, importing nothing else of it: the simulated provider,
:mod:`coalesce.testing`, does (``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

from ._exceptions import (
    BatcherClosedError,
    BatchError,
    CoalesceError,
    CoalesceWarning,
    ConfigurationError,
    InvalidInputError,
    InvalidOutputError,
    ItemError,
    MissingOutputError,
    QueueFull,
    RequestTimeoutError,
    ResultCountError,
    TruncatedOutputError,
    UnknownOptionError,
)

__all__ = [
    "BatchError",
    "BatcherClosedError",
    "CoalesceError",
    "CoalesceWarning",
    "ConfigurationError",
    "InvalidInputError",
    "InvalidOutputError",
    "ItemError",
    "MissingOutputError",
    "QueueFull",
    "RequestTimeoutError",
    "ResultCountError",
    "TruncatedOutputError",
    "UnknownOptionError",
]

"""Stand-ins for an SDK client's resources: every attribute the resource's own, but a
chosen few methods, named by their path from the client (``chat.completions.create``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Proxy", "overlay"]

#: Given the SDK's own method, the method that stands in for it.
Replace = Callable[[Any], Any]


class Proxy:
    """Delegates every attribute to ``target`` except those in ``own``."""

    def __init__(self, target: Any, own: Mapping[str, Any]) -> None:
        self._target = target
        self._own = dict(own)

    def __getattr__(self, name: str) -> Any:
        own = self.__dict__.get("_own", {})
        if name in own:
            return own[name]
        return getattr(self.__dict__["_target"], name)

    def __repr__(self) -> str:
        return f"<coalesced {self._target!r}>"


def overlay(target: Any, methods: Mapping[str, Replace]) -> dict[str, Any]:
    """The attributes of ``target`` to stand in for, so that each path of ``methods``
    that ``target`` has leads to its replacement (``methods[path](target.<path>)``).

    A path this SDK version lacks (an older SDK without ``parse``, a client without
    ``beta``) is left out: the client keeps behaving as itself there.

    Args:
        target: The SDK client, or one of its resources.
        methods: Replacements by dotted attribute path from ``target``.
    """
    own: dict[str, Any] = {}
    nested: dict[str, dict[str, Replace]] = {}
    for path, replace in methods.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = replace
        elif (method := getattr(target, head, None)) is not None:
            own[head] = replace(method)
    for head, inner in nested.items():
        resource = getattr(target, head, None)
        below = {} if resource is None else overlay(resource, inner)
        if below:
            own[head] = Proxy(resource, below)
    return own

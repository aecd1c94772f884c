"""The wrapped client as an instance of the SDK client's own class.

``wrap(client)`` returns an instance of a subclass of ``type(client)``
(``CoalescedAsyncOpenAI``, made once per SDK class by :func:`coalesced_class`) that
holds the client's own state (its options, credentials and HTTP client), so
``isinstance(wrapped, openai.AsyncOpenAI)`` holds and every attribute behaves as the
SDK's. :func:`coalesced_copy` builds it, and the resources on the way to a replaced
method (``chat``, then ``chat.completions``), the same way; :func:`replace_methods`
then puts the coalescing methods on them: each is a copy of the
client's own resource whose other resources are the client's own (``wrapped.models
is client.models``), and whose ``with_raw_response`` / ``with_streaming_response`` are
built afresh by the SDK around the replaced methods.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["RAW_FORMS", "Replace", "coalesced_class", "coalesced_copy", "replace_methods"]

#: Given the SDK's own method, the method that stands in for it.
Replace = Callable[[Any], Any]

#: The SDK's raw-response forms of a resource, built around its methods as they are.
RAW_FORMS = frozenset({"with_raw_response", "with_streaming_response"})

_CLASSES: dict[tuple[type | None, type, frozenset[str]], type] = {}


class _Delegate:
    """A resource of the object a copy was made from (its ``_coalesce_source``): the
    same object, not one built for the copy. Assigning to it on an instance sets the
    instance's own attribute, as for the SDK's cached properties."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return getattr(instance._coalesce_source, self.name)


def _cached(cls: type) -> frozenset[str]:
    """The names of ``cls``'s cached properties (the SDK builds its resources so)."""
    return frozenset(
        name
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if isinstance(value, functools.cached_property)
    )


def coalesced_class(base: type, own: frozenset[str], mixin: type | None = None) -> type:
    """The subclass of the SDK class ``base`` whose resources are its source's, but
    those named in ``own`` (built for the instance the SDK's way); ``mixin`` first in
    its MRO if given. Made once per ``(mixin, base, own)``.

    Args:
        base: The SDK client class, or a resource class.
        own: The resources each instance builds for itself.
        mixin: A class to put before ``base`` (the client's :class:`CoalescedClient`).
    """
    made = _CLASSES.get((mixin, base, own))
    if made is None:
        name = f"Coalesced{base.__name__}"
        body: dict[str, Any] = {"__qualname__": name, "__module__": __name__}
        body.update({n: _Delegate(n) for n in _cached(base) - own})
        made = type(name, (base,) if mixin is None else (mixin, base), body)
        _CLASSES[(mixin, base, own)] = made
    return made


def _below(paths: Iterable[str]) -> dict[str, list[str]]:
    """The rest of each path, by the resource it goes through first."""
    below: dict[str, list[str]] = {}
    for path in paths:
        head, _, rest = path.partition(".")
        if rest:
            below.setdefault(head, []).append(rest)
    return below


def coalesced_copy(source: Any, paths: Iterable[str], mixin: type | None = None) -> Any:
    """A copy of ``source`` (an SDK client or resource), ready for the methods at
    ``paths`` to be replaced (:func:`replace_methods`).

    The copy holds ``source``'s state (the same options, credentials, HTTP client);
    its resources are ``source``'s own except those on the way to a path, copies
    made the same way, and its ``with_raw_response`` / ``with_streaming_response``,
    which the SDK builds for it when first asked (around the methods it then has).

    Args:
        source: The SDK client, or one of its resources.
        paths: Dotted attribute paths of the methods to be replaced.
        mixin: A class for the copy to be an instance of as well.
    """
    below = _below(paths)
    resources = {head: getattr(source, head, None) for head in below}
    resources = {head: resource for head, resource in resources.items() if resource is not None}
    cls = coalesced_class(type(source), frozenset(resources) | RAW_FORMS, mixin)
    copy: Any = object.__new__(cls)
    skip = _cached(type(source))
    vars(copy).update({k: v for k, v in vars(source).items() if k not in skip})
    copy._coalesce_source = source
    for head, resource in resources.items():
        # Where the SDK's cached property keeps it: built once, for this copy.
        vars(copy)[head] = coalesced_copy(resource, below[head])
    return copy


def replace_methods(copy: Any, methods: Mapping[str, Replace]) -> None:
    """Replace each method at ``copy.<path>`` by ``methods[path](its source's method)``:
    the replacement is given the method of the object the resource was copied from,
    to pass calls on to. A path the SDK lacks is left out.

    Args:
        copy: What :func:`coalesced_copy` made for these paths.
        methods: Replacements by dotted attribute path.
    """
    for path, replace in methods.items():
        *heads, name = path.split(".")
        owner = copy
        for head in heads:
            owner = vars(owner).get(head) if owner is not None else None
        source = getattr(owner, "_coalesce_source", None)
        if (method := getattr(source, name, None)) is not None:
            setattr(owner, name, replace(method))

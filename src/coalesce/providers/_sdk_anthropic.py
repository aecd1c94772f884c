"""Every internal of the ``anthropic`` SDK that coalesce uses, and where the SDK keeps it.

As ``_sdk_openai`` for the openai SDK: named here and nowhere else in coalesce
(``tests/wrap/test_sdk_internals.py`` checks both), each imported only when first used.
"""

from __future__ import annotations

from typing import Any

from ._sdk_openai import load_internal

__all__ = ["ATTRIBUTES", "INTERNALS", "SUPPORTED", "TESTED"]

#: The releases coalesce supports (the ``anthropic`` extra in ``pyproject.toml``). From
#: 1.0 the SDK is built on ``httpx2``, as the openai SDK 3.x is and as coalesce's raw
#: responses and the simulator's in-process transport are; before it, on ``httpx``.
SUPPORTED = ">=1,<3"
#: ...and the releases besides the newest that CI runs the wrap and gateway tests on
#: (``.ci/run``): the oldest, and one between.
TESTED = ("1.0.0", "2.0.0")

#: Each internal by name, and the SDK module that holds it.
INTERNALS: dict[str, str] = {
    # Which SDK clients have a default connection pool (``providers/_sdk.py``, by name).
    "AsyncHttpxClientWrapper": "anthropic._base_client",
    # Raw responses of coalesced calls (``_wrap/raw.py``).
    "FinalRequestOptions": "anthropic._models",
    "AsyncAPIResponse": "anthropic._response",
    # The largest non-streaming ``max_tokens`` per model (``providers/_anthropic.py``).
    "MODEL_NONSTREAMING_TOKENS": "anthropic._constants",
    # ``messages.parse`` (``_wrap/anthropic_parse.py``).
    "parse_response": "anthropic.lib._parse._response",
}


#: Private attributes of the SDK's objects that coalesce reads, by the public class that
#: has them. They are read where the object is, by these names only.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    # Its connection pool (``providers/_sdk.py``), its default headers and query
    # (``_wrap/sync_client.py``).
    "AsyncAnthropic": ("_client", "_custom_headers", "_custom_query"),
    # Its event type and request options, for a blocking twin (``_wrap/stream.py``).
    "AsyncStream": ("_cast_to",),
}


def __getattr__(name: str) -> Any:
    """The SDK's own ``name``, imported from where :data:`INTERNALS` says it is.

    Raises:
        AttributeError: ``name`` is not one of :data:`INTERNALS`.
        ImportError: The installed SDK keeps it elsewhere, or has none.
    """
    return load_internal("anthropic", name, INTERNALS, SUPPORTED, TESTED)

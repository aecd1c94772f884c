"""Every internal of the ``openai`` SDK that coalesce uses, and where the SDK keeps it.

coalesce builds the SDK's own objects for coalesced calls (raw responses, parsed
completions), which takes a few of the SDK's private names. They are named here and
nowhere else in coalesce (``tests/wrap/test_sdk_internals.py`` checks both), so a
release that moves one fails that test by name, and this table is the one place to
follow it. Each is imported only when first used (``from ._sdk_openai import
parse_chat_completion``): importing coalesce still imports no SDK.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["ATTRIBUTES", "INTERNALS", "SUPPORTED", "TESTED"]

#: The releases coalesce supports (the ``openai`` extra in ``pyproject.toml``)...
SUPPORTED = ">=3.14,<4"
#: ...and the releases besides the newest that CI runs the wrap and gateway tests on
#: (``.ci/run``): the oldest, and one between.
TESTED = ("3.14.0", "3.30.0")

#: Each internal by name, and the SDK module that holds it.
INTERNALS: dict[str, str] = {
    # Which SDK clients have a default connection pool (``providers/_sdk.py``, by name).
    "AsyncHttpxClientWrapper": "openai._base_client",
    # Raw responses of coalesced calls (``_wrap/raw.py``); a packed request posted as
    # ``create()`` posts it (``providers/_openai.py``).
    "FinalRequestOptions": "openai._models",
    "RAW_RESPONSE_HEADER": "openai._constants",
    "LegacyAPIResponse": "openai._legacy_response",
    "AsyncAPIResponse": "openai._response",
    # ``chat.completions.parse`` (``_wrap/openai_parse.py``); ``openai.lib`` re-exports
    # type_to_response_format_param only in later 3.x releases.
    "validate_input_tools": "openai.lib._parsing._completions",
    "parse_chat_completion": "openai.lib._parsing._completions",
    "type_to_response_format_param": "openai.lib._parsing._completions",
    # ``responses.parse`` (``_wrap/openai_responses_parse.py``).
    "type_to_text_format_param": "openai.lib._parsing._responses",
    "parse_response": "openai.lib._parsing._responses",
}


#: Private attributes of the SDK's objects that coalesce reads, by the public class that
#: has them. They are read where the object is, by these names only.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    # Its connection pool (``providers/_sdk.py``), its default headers and query
    # (``_wrap/sync_client.py``).
    "AsyncOpenAI": ("_client", "_custom_headers", "_custom_query"),
    # Its event type and request options, for a blocking twin (``_wrap/stream.py``).
    "AsyncStream": ("_cast_to",),
}


def __getattr__(name: str) -> Any:
    """The SDK's own ``name``, imported from where :data:`INTERNALS` says it is.

    Raises:
        AttributeError: ``name`` is not one of :data:`INTERNALS`.
        ImportError: The installed SDK keeps it elsewhere, or has none.
    """
    return load_internal("openai", name, INTERNALS, SUPPORTED, TESTED)


def load_internal(
    sdk: str, name: str, internals: dict[str, str], supported: str, tested: tuple[str, ...]
) -> Any:
    """``sdk``'s own ``name``, imported from the module ``internals`` names for it (what
    each SDK's module's ``__getattr__`` does).

    Raises:
        AttributeError: ``name`` is not one of ``internals``.
        ImportError: The installed SDK keeps it elsewhere, or has none.
    """
    where = internals.get(name)
    if where is None:
        raise AttributeError(f"no SDK internal {name!r} is known for {sdk}")
    try:
        return getattr(importlib.import_module(where), name)
    except (ImportError, AttributeError) as exc:
        version = getattr(sys.modules.get(sdk), "__version__", "(none installed)")
        raise ImportError(
            f"{sdk} {version} has no {where}.{name}, which coalesce uses: coalesce supports "
            f"{sdk}{supported} and is tested on {', '.join(tested)} and the newest "
            "(docs/wrap.md, Supported versions)"
        ) from exc

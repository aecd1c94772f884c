"""Whether a provider's replies can be trusted to follow the reply schema.

A streamed answer can be handed to its caller the moment its own output is complete,
but only if nothing later in the reply can contradict it. A provider that enforces
the reply schema (structured outputs with a strict schema, a grammar) cannot write an
id twice; one that only reads the schema as a hint (many OpenAI-compatible servers
ignore ``response_format``) can, and the first answer may be the wrong one.

:func:`declared_enforcement` reads what the provider (or the ``schema_enforced``
option) declares; :class:`SchemaTrust` starts there and stops trusting at the first
reply that breaks the schema. While it does not trust, the group runner holds every
streamed answer until the reply ends and judges the complete reply, as it does a
reply that was not streamed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._calls import NoObserver
from .._wire.outcomes import FailureKind, Split

if TYPE_CHECKING:
    from .._calls import RequestReport
    from ..providers import Provider

__all__ = ["SchemaTrust", "declared_enforcement", "schema_broken"]

#: Failures a reply that follows the schema cannot produce (a complete reply lists
#: every id once). An invalid output can: validators may check more than the schema.
_SCHEMA_FAILURES = frozenset({FailureKind.DUPLICATE, FailureKind.MISSING})


def declared_enforcement(provider: Provider, option: bool | None) -> bool:
    """Whether replies are taken to follow the schema before any is seen.

    Args:
        provider: The function's provider; its optional ``enforces_schema`` attribute
            says what it guarantees (absent: nothing).
        option: The ``schema_enforced`` option; ``None`` defers to the provider.
    """
    if not getattr(provider, "structured", False):
        return False  # the schema is only described in the prompt
    if option is not None:
        return option
    return bool(getattr(provider, "enforces_schema", False))


def schema_broken(split: Split[Any]) -> bool:
    """Whether a complete reply broke the reply schema (see ``_SCHEMA_FAILURES``)."""
    if split.unknown_ids:
        return True
    return any(failure.kind in _SCHEMA_FAILURES for failure in split.failures.values())


class SchemaTrust(NoObserver):
    """Whether answers may be handed over while their reply still streams; learned.

    Listens to the group runner (a :class:`~coalesce._calls.GroupObserver`): the
    first report of a reply that broke the schema, or contradicted an answer already
    delivered, ends the trust for good.

    Args:
        enforced: What the provider declared (see :func:`declared_enforcement`).
    """

    def __init__(self, enforced: bool) -> None:
        self.enforced = enforced

    def request_done(self, report: RequestReport) -> None:
        """Stop trusting after a reply that broke the schema."""
        if report.schema_broken or report.contradicted:
            self.enforced = False

    def __repr__(self) -> str:
        return f"<SchemaTrust enforced={self.enforced}>"

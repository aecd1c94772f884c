"""Anthropic's beta structured outputs, read as the generally available form.

litellm (and other clients written before structured outputs left beta) ask a Claude
model for JSON with the ``anthropic-beta: structured-outputs-2025-11-13`` header and a
top-level ``output_format``. The generally available API takes the same schema as
``output_config.format`` and needs no beta. The gateway rewrites the first into the
second before the call reaches ``coalesce.wrap``, which coalesces ``output_config``
calls (it passes through a call with a beta it does not know, as it must). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["STRUCTURED_OUTPUTS_BETA", "general_form"]

#: The beta that carried structured outputs before they were generally available.
STRUCTURED_OUTPUTS_BETA = "structured-outputs-2025-11-13"


def general_form(body: dict[str, Any], betas: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``body`` and ``betas`` with a beta ``output_format`` moved to
    ``output_config.format`` and its beta dropped (in a new body); ``body`` itself when it
    has no ``output_format``, already has an ``output_config``, or does not send the
    beta.

    Args:
        body: The ``/v1/messages`` request body (never changed).
        betas: The ``anthropic-beta`` header's values.
    """
    if (
        STRUCTURED_OUTPUTS_BETA not in betas
        or "output_format" not in body
        or "output_config" in body
    ):
        return body, list(betas)
    given = dict(body)
    given["output_config"] = {"format": given.pop("output_format")}
    return given, [beta for beta in betas if beta != STRUCTURED_OUTPUTS_BETA]

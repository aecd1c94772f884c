"""``coalesce serve``: an OpenAI- and Anthropic-compatible HTTP gateway that coalesces
the calls of every process and language behind it, through ``coalesce.wrap``.

The layer above the drop-in client: :mod:`.app` (the Starlette app), :mod:`.routes`
(the coalescing routes), :mod:`.proxy` (every other path), :mod:`.upstream` (the
wrapped SDK clients), :mod:`.callers` (credentials), :mod:`.controls` (the
``x-coalesce-*`` headers), :mod:`.errors`, :mod:`.metrics`, :mod:`.logs`,
:mod:`.config` and :mod:`.server` (the command). See ``docs/gateway.md``.

Importing this package imports none of the gateway's dependencies.
"""

from __future__ import annotations

from .config import GatewayConfig

__all__ = ["GatewayConfig"]

"""Providers bound to the simulated provider, one of each kind: shared by the
provider tests and the retry tests."""

from __future__ import annotations

from typing import Any

import httpx

from coalesce.providers import AnthropicProvider, OpenAICompatibleProvider, OpenAIProvider
from coalesce.testing import SimulatedDisconnect, SimulatedProvider

KINDS = ["openai", "anthropic", "compatible"]


class DroppingTransport(httpx.ASGITransport):
    """``httpx.ASGITransport`` with the simulator's dropped connection as a real one's error."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except SimulatedDisconnect as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc


def make_provider(sim: SimulatedProvider, kind: str, base_url: str | None = None) -> Any:
    """A provider of ``kind`` bound to ``sim`` (in process when ``base_url`` is None)."""
    if kind == "openai":
        return OpenAIProvider(sim.openai_client(base_url))
    if kind == "anthropic":
        return AnthropicProvider(sim.anthropic_client(base_url))
    if base_url is not None:
        return OpenAICompatibleProvider(base_url, "sk-test", timeout=5)
    client = httpx.AsyncClient(transport=DroppingTransport(app=sim))
    return OpenAICompatibleProvider("http://sim.test/v1", "sk-test", http_client=client)


async def close(provider: Any) -> None:
    """Close the client under ``provider`` (the SDK copies share the caller's)."""
    if isinstance(provider, OpenAICompatibleProvider):
        await provider._client.aclose()
    else:
        await provider._client.close()

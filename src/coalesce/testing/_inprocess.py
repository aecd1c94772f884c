"""The in-process transport: ``httpx2.ASGITransport`` with network-like failures.

Imported only when a client is made in process, so importing the package never
imports ``httpx2``.
"""

from __future__ import annotations

import httpx2

from ._asgi import SimulatedDisconnect

__all__ = ["SimulatedTransport"]


class SimulatedTransport(httpx2.ASGITransport):
    """Calls the provider in process; a simulated dropped connection surfaces as
    ``httpx2.RemoteProtocolError``, as it would over a real socket, so the SDKs
    report it as their own connection error.
    """

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send one request to the app.

        Args:
            request: The request.

        Raises:
            httpx2.RemoteProtocolError: The ``disconnect`` fault dropped the connection.
        """
        try:
            return await super().handle_async_request(request)
        except SimulatedDisconnect as exc:
            raise httpx2.RemoteProtocolError(str(exc), request=request) from exc

"""Pytest fixtures that start a simulated provider for the user's own tests.

Enable them in a ``conftest.py``::

    pytest_plugins = ["coalesce.testing.pytest_plugin"]

and configure the provider by overriding ``simulated_provider_options``.

The fixtures are plain (not async) fixtures, so they work under whichever runner
drives the async tests: anyio's pytest plugin (``@pytest.mark.anyio``) or
pytest-asyncio (``@pytest.mark.asyncio``, or its auto mode). The provider touches no
event loop until a request arrives, and then uses the loop of the test that sends it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ._provider import SimulatedProvider

__all__ = ["simulated_provider", "simulated_provider_options", "simulated_provider_url"]


@pytest.fixture
def simulated_provider_options() -> dict[str, Any]:
    """Keyword arguments of :class:`SimulatedProvider`; override it to configure.

    The default is the plain provider: realistic latencies (free on virtual time),
    no rate limits, no faults.
    """
    return {}


@pytest.fixture
def simulated_provider(simulated_provider_options: dict[str, Any]) -> SimulatedProvider:
    """A fresh :class:`SimulatedProvider` for this test, to use in process."""
    return SimulatedProvider(**simulated_provider_options)


@pytest.fixture
def simulated_provider_url(simulated_provider: SimulatedProvider) -> Iterator[str]:
    """The base URL of ``simulated_provider`` served on 127.0.0.1 for this test.

    The OpenAI SDK wants ``f"{url}/v1"``; the Anthropic SDK takes ``url`` itself.
    The server runs in a thread with its own event loop, whatever runs the test.
    Real sockets need the real clock: run such tests without a virtual clock (no
    trio ``MockClock``, no ``looptime``) and give the provider a small ``time_scale``.
    """
    with simulated_provider.serve() as url:
        yield url

"""The pytest plugin of the simulated provider.

Add to your ``conftest.py``::

    pytest_plugins = ["coalesce.testing.pytest_plugin"]

Fixtures: ``simulated_provider`` (in process), ``simulated_provider_url`` (served
on 127.0.0.1) and ``simulated_provider_options`` (override it to configure).
"""

from __future__ import annotations

from ._pytest import simulated_provider, simulated_provider_options, simulated_provider_url

__all__ = ["simulated_provider", "simulated_provider_options", "simulated_provider_url"]

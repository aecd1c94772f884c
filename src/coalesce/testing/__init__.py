"""A simulated LLM provider for tests: OpenAI and Anthropic APIs, deterministic answers.

Use it in process (it is an ASGI app: ``httpx2.ASGITransport(app=sim)``), over real
HTTP (``with sim.serve() as base_url:``), through the pytest plugin
(``pytest_plugins = ["coalesce.testing.pytest_plugin"]``) or from the command line
(``coalesce simulate --port 8000``). See the testing guide.

Importing this package imports neither uvicorn nor any SDK.
"""

from __future__ import annotations

from ._accounting import RequestRecord, SimulatorStatistics
from ._batches import BatchSubmission, BatchTiming
from ._cache import SimulatedPromptCache
from ._degradation import PackingDegradation, degraded_output
from ._faults import Fault, FaultPlan
from ._flex import FlexProcessing
from ._http import SimulatedDisconnect
from ._latency import Delays, LatencyProfile, SimulatedLatency, compute_delays
from ._length import LongTail
from ._model import expected_output
from ._provider import SimulatedProvider
from ._ratelimit import RateLimit, RateLimits
from ._wire import item_output_schema

#: The former name of :class:`SimulatedLatency`, kept so that existing code still runs.
LatencyModel = SimulatedLatency

__all__ = [
    "BatchSubmission",
    "BatchTiming",
    "Delays",
    "Fault",
    "FaultPlan",
    "FlexProcessing",
    "LatencyModel",
    "LatencyProfile",
    "LongTail",
    "PackingDegradation",
    "RateLimit",
    "RateLimits",
    "RequestRecord",
    "SimulatedDisconnect",
    "SimulatedLatency",
    "SimulatedPromptCache",
    "SimulatedProvider",
    "SimulatorStatistics",
    "compute_delays",
    "degraded_output",
    "expected_output",
    "item_output_schema",
]

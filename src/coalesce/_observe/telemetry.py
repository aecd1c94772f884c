"""OpenTelemetry metrics for a recorder, when ``opentelemetry-api`` is installed.

The API is imported lazily, on the first recorder: importing ``coalesce`` never
imports OpenTelemetry, and without it :meth:`Telemetry.create` returns ``None`` and
nothing is recorded.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Any

from ..providers import Usage

__all__ = ["Telemetry", "instruments"]


class Telemetry:
    """OpenTelemetry instruments for one recorder (shared per meter), and its attributes.

    Args:
        instruments: The meter's instruments (see :func:`instruments`).
        function: The decorated function's (or wrapped client's) name.
        model: The model name.
    """

    def __init__(self, instruments: Mapping[str, Any], function: str, model: str) -> None:
        self._i = instruments
        self._attrs = {"coalesce.function": function, "gen_ai.request.model": model}
        self._ok = {**self._attrs, "coalesce.outcome": "ok"}
        self._error = {**self._attrs, "coalesce.outcome": "error"}
        self._input = {**self._attrs, "gen_ai.token.type": "input"}
        self._output = {**self._attrs, "gen_ai.token.type": "output"}
        self._reask = {**self._attrs, "coalesce.reask": True}
        self._first = {**self._attrs, "coalesce.reask": False}

    @classmethod
    def create(cls, function: str, model: str, meter_provider: Any) -> Telemetry | None:
        """Instruments from ``meter_provider`` (or the global one); ``None`` without OTel."""
        try:
            metrics: Any = importlib.import_module("opentelemetry.metrics")
        except ImportError:
            return None
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        return cls(instruments(provider), function, model)

    def call(self, latency: float, wait: float | None, ok: bool, *, missed: bool) -> None:
        """Record a finished call: its latency, its wait, whether it missed its budget."""
        self._i["call.duration"].record(latency, self._ok if ok else self._error)
        if wait is not None:
            self._i["call.wait"].record(wait, self._attrs)
        if missed:
            self._i["budget.misses"].add(1, self._attrs)

    def dispatched(self, reason: str) -> None:
        """Count a group dispatched for ``reason``."""
        self._i["dispatches"].add(1, {**self._attrs, "coalesce.dispatch.reason": reason})

    def request(
        self,
        items: int,
        usage: Usage | None,
        ttft: float | None,
        seconds: float | None,
        spent: float,
        baseline: float,
        reask: bool,
    ) -> None:
        """Record a request's reply: its size, times, tokens and cost (NaN: unknown)."""
        attrs = self._reask if reask else self._first
        self._i["request.items"].record(items, attrs)
        if seconds is not None:
            self._i["request.duration"].record(seconds, attrs)
        if ttft is not None:
            self._i["request.ttft"].record(ttft, attrs)
        if usage is not None:
            self._i["tokens"].add(usage.input_tokens, self._input)
            self._i["tokens"].add(usage.output_tokens, self._output)
        if not math.isnan(spent):
            self._i["cost"].add(spent, self._attrs)
            self._i["cost.one_per_item"].add(baseline, self._attrs)
        if reask:
            self._i["reasks"].add(items, self._attrs)

    def request_failed(self, reask: bool) -> None:
        """Count a request that failed as a whole."""
        self._i["request.failures"].add(1, self._reask if reask else self._first)

    def retried(self) -> None:
        """Count a request sent again."""
        self._i["retries"].add(1, self._attrs)

    def unmeetable(self) -> None:
        """Count a call whose budget could not be met even alone."""
        self._i["budget.unmeetable"].add(1, self._attrs)


# Instruments by meter provider: creating the same instrument twice on one meter
# makes the SDK log a warning, and there is one recorder per decorated function.
_INSTRUMENTS: dict[int, tuple[Any, Mapping[str, Any]]] = {}


def instruments(provider: Any) -> Mapping[str, Any]:
    """The ``coalesce`` meter's instruments on ``provider``, created once per provider."""
    cached = _INSTRUMENTS.get(id(provider))
    if cached is not None and cached[0] is provider:
        return cached[1]
    meter = provider.get_meter("coalesce")
    h, c = meter.create_histogram, meter.create_counter
    made = {
        "call.duration": h("coalesce.call.duration", "s", "Latency of a call, end to end"),
        "call.wait": h("coalesce.call.wait", "s", "Wait for company before the first request"),
        "request.duration": h("coalesce.request.duration", "s", "Duration of a request"),
        "request.ttft": h("coalesce.request.ttft", "s", "Time to the first reply token"),
        "request.items": h("coalesce.request.items", "{item}", "Items per request"),
        "request.failures": c("coalesce.request.failures", "{request}", "Requests failed"),
        "tokens": c("coalesce.tokens", "{token}", "Tokens reported by the provider"),
        "cost": c("coalesce.cost", "USD", "Estimated cost"),
        "cost.one_per_item": c(
            "coalesce.cost.one_per_item", "USD", "Estimated cost of one request per item"
        ),
        "dispatches": c("coalesce.dispatches", "{request}", "Groups dispatched, by reason"),
        "budget.misses": c("coalesce.budget.misses", "{call}", "Calls finished after budget"),
        "budget.unmeetable": c(
            "coalesce.budget.unmeetable", "{call}", "Calls whose budget could not be met alone"
        ),
        "retries": c("coalesce.retries", "{request}", "Requests sent again"),
        "reasks": c("coalesce.reasks", "{item}", "Items asked again"),
    }
    _INSTRUMENTS[id(provider)] = (provider, made)
    return made

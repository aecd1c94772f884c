"""The gateway's Prometheus metrics, and what it learns of each upstream request.

:class:`GatewayMetrics` owns a registry of its own (``GET /metrics`` renders it) and
hears of every upstream request from two places: ``coalesce.wrap``'s ``on_event`` hook
(:meth:`GatewayMetrics.hook`: a :class:`~coalesce.RequestEvent` per packed or plain
request, with its items and tokens) and the routes (:meth:`GatewayMetrics.alone`: a
call ``wrap`` passed through; :meth:`GatewayMetrics.proxied`: any other path). Each
also writes the request's log line (:func:`~coalesce._gateway.logs.log_upstream`).

Labels are the provider, the API, the model (:func:`~coalesce._gateway.logs.label`:
a plain name, else ``other``; past :data:`MAX_MODELS` distinct ones, ``other``), the
lane, the kind of request and its outcome: never a credential, a header or a body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .._fleet import FleetStatistics
from .._observe.events import Event, RequestEvent
from .logs import label, log_upstream

__all__ = ["CONTENT_TYPE", "MAX_MODELS", "GatewayMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Distinct model labels kept; later ones are counted as ``other``.
MAX_MODELS = 200
_ITEMS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
_RATIO = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0, 4.0)


class GatewayMetrics:
    """Every metric of one gateway, in its own registry (see the module doc)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        call = ["api", "model", "lane", "status"]
        self.calls = Counter(
            "coalesce_gateway_calls", "Calls answered, by status.", call, registry=r
        )
        self.in_flight = Gauge(
            "coalesce_gateway_calls_in_flight", "Calls being answered.", registry=r
        )
        self.latency = Histogram(
            "coalesce_gateway_call_seconds",
            "Seconds from a call to its reply.",
            call[:3],
            registry=r,
        )
        self.budget = Counter(
            "coalesce_gateway_budget_calls", "Calls with a budget, by whether they met it.",
            [*call[:3], "within"], registry=r,
        )  # fmt: skip
        self.budget_used = Histogram(
            "coalesce_gateway_budget_used_ratio", "A call's seconds over its budget.",
            ["lane"], buckets=_RATIO, registry=r,
        )  # fmt: skip
        up = ["provider", "model", "lane", "kind", "outcome"]
        self.upstream = Counter(
            "coalesce_gateway_upstream_requests", "Requests sent upstream.", up, registry=r
        )
        self.items = Histogram(
            "coalesce_gateway_items_per_request", "Calls carried by one upstream request.",
            up[:3], buckets=_ITEMS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "coalesce_gateway_prompt_tokens",
            "Prompt tokens of coalesced requests.",
            up[:3],
            registry=r,
        )
        self.plain_tokens = Counter(
            "coalesce_gateway_plain_prompt_tokens",
            "Prompt tokens the same calls would have used as plain calls (estimated).",
            up[:3], registry=r,
        )  # fmt: skip
        self.saved = Gauge(
            "coalesce_gateway_prompt_tokens_saved",
            "Prompt tokens saved against plain calls (negative where packing cost more).",
            up[:3], registry=r,
        )  # fmt: skip
        self._models: set[str] = set()
        # Each labelled child once: ``labels()`` takes a lock and checks its arguments
        # on every call, a measurable share of a proxied call's cost.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _of(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def model(self, value: Any) -> str:
        """``value`` as a model label (see the module doc)."""
        name = label(value)
        if name not in self._models:
            if len(self._models) >= MAX_MODELS:
                return "other"
            self._models.add(name)
        return name

    def hook(self, provider: str) -> Callable[[Event], None]:
        """The ``on_event`` hook of ``provider``'s wrapped client."""

        def on_event(event: Event) -> None:
            if isinstance(event, RequestEvent):
                self._request(provider, event)

        return on_event

    def _request(self, provider: str, event: RequestEvent) -> None:
        model, lane = self.model(event.model), "realtime"
        kind = "plain" if event.plain else "packed"
        outcome = "ok" if event.error is None else _error_name(event.error)
        self._of(self.upstream, provider, model, lane, kind, outcome).inc()
        self._of(self.items, provider, model, lane).observe(event.items)
        usage = event.usage
        if usage is not None:
            plain = event.input_tokens_one_per_item
            self.prompt_tokens.labels(provider, model, lane).inc(usage.input_tokens)
            self.plain_tokens.labels(provider, model, lane).inc(plain)
            self.saved.labels(provider, model, lane).inc(plain - usage.input_tokens)
        log_upstream(
            {
                "provider": provider, "model": model, "lane": lane, "kind": kind,
                "items": event.items, "outcome": outcome, "seconds": _round(event.seconds),
                "attempt": event.attempt or None, "reask": event.reask or None,
                "prompt_tokens": None if usage is None else usage.input_tokens,
                "plain_prompt_tokens": event.input_tokens_one_per_item or None,
                "output_tokens": None if usage is None else usage.output_tokens,
                "request_id": label(event.request_id) if event.request_id else None,
                "group": event.group or None,
            }
        )  # fmt: skip

    def alone(
        self, provider: str, api: str, model: str, lane: str, status: int, seconds: float
    ) -> None:
        """A call ``wrap`` passed through: one upstream request of its own."""
        outcome = "ok" if status < 400 else str(status)
        self._of(self.upstream, provider, model, lane, "alone", outcome).inc()
        self._of(self.items, provider, model, lane).observe(1)
        log_upstream(
            {
                "provider": provider, "api": api, "model": model, "lane": lane,
                "kind": "alone", "items": 1, "outcome": outcome, "seconds": _round(seconds),
            }
        )  # fmt: skip

    def proxied(self, provider: str, method: str, path: str, status: int, seconds: float) -> None:
        """A request of another path, proxied untouched (its path shown, no query)."""
        outcome = "ok" if status < 400 else str(status)
        self._of(self.upstream, provider, "none", "none", "proxied", outcome).inc()
        log_upstream(
            {
                "provider": provider, "kind": "proxied", "method": method, "path": "/" + label(path.lstrip("/")),
                "outcome": outcome, "seconds": _round(seconds),
            }
        )  # fmt: skip

    def call_done(
        self, api: str, model: str, lane: str, status: int, seconds: float, budget: float | None
    ) -> None:
        """A call through a coalescing route got its reply (or its error)."""
        self._of(self.calls, api, model, lane, str(status)).inc()
        self._of(self.latency, api, model, lane).observe(seconds)
        if budget is not None:
            within = "true" if seconds <= budget else "false"
            self._of(self.budget, api, model, lane, within).inc()
            self._of(self.budget_used, lane).observe(seconds / budget)

    def watch_fleet(self, statistics: Callable[[], FleetStatistics]) -> None:
        """Show a fleet member's counters (read at each scrape from ``statistics``)."""
        self.registry.register(_FleetCollector(statistics))

    def render(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


def _error_name(error: BaseException) -> str:
    status = getattr(error, "status_code", None)
    return str(status) if isinstance(status, int) else type(error).__name__


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


#: The fleet's metrics: (name, help, kind) per :class:`FleetStatistics` field.
_FLEET = (
    ("forwarded", "coalesce_fleet_calls_forwarded", "Calls sent to their partition's owner and answered there.", "counter"),
    ("served", "coalesce_fleet_calls_served", "Calls other members forwarded here.", "counter"),
    ("fallbacks", "coalesce_fleet_fallbacks", "Calls answered here for want of the fleet (NATS down, owner silent).", "counter"),
    ("lease_changes", "coalesce_fleet_lease_changes", "Leases acquired, taken over, lost or let go here.", "counter"),
    ("takeovers", "coalesce_fleet_takeovers", "Leases taken from an owner found gone.", "counter"),
    ("owned", "coalesce_fleet_owned_partitions", "Partitions whose lease this member holds.", "gauge"),
    ("connected", "coalesce_fleet_connected", "1 while connected to NATS and the lease bucket.", "gauge"),
)  # fmt: skip


class _FleetCollector:
    """A fleet member's counters as Prometheus metrics, labelled by member id."""

    def __init__(self, statistics: Callable[[], FleetStatistics]) -> None:
        self.statistics = statistics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        now = self.statistics()
        found: list[Metric] = []
        for field, name, meaning, kind in _FLEET:
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            metric = family(name, meaning, labels=["member"])
            metric.add_metric([now.member], float(getattr(now, field)))
            found.append(metric)
        return found

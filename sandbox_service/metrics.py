"""Prometheus metrics of the service, on a registry of its own (one per app, so tests can build several).

Request metrics are recorded by the service's one ASGI middleware (`sandbox_service.server.app`) and labelled
by route template (`/v1/sandboxes/{sandbox_id}/exec`), never by raw path, so ids do not explode the
label space.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_FAST_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)


class ServiceMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "orchard_http_requests_total",
            "HTTP requests by route, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "orchard_http_request_seconds",
            "HTTP request latency by route.",
            ["route", "method"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.exec_seconds = Histogram(
            "orchard_exec_seconds",
            "Exec latency through the agent, by outcome.",
            ["outcome"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.creates = Counter("orchard_sandbox_creates_total", "Sandbox creations by result.", ["result"], registry=r)
        self.create_seconds = Histogram(
            "orchard_sandbox_create_seconds", "Create request to ready.", buckets=_FAST_BUCKETS, registry=r
        )
        self.failures = Counter("orchard_failures_total", "Infrastructure failures by kind.", ["kind"], registry=r)
        self.escalations = Counter("orchard_escalations_total", "Resource escalations (OOM recreations).", registry=r)
        self.rejections = Counter(
            "orchard_rejected_total", "Requests refused with 503 because a cap was reached.", ["cap"], registry=r
        )
        self.sandboxes = Gauge("orchard_sandboxes", "Sandboxes known to the service, by state.", ["state"], registry=r)
        self.execs_in_flight = Gauge("orchard_execs_in_flight", "Execs running now.", registry=r)
        self.jobs = Gauge("orchard_jobs", "Exec jobs known to the service, by state.", ["state"], registry=r)
        self._collect_hooks: list[Callable[[], None]] = []
        # Labelled children cached by label values: `labels()` costs a lock and a dict build per call.
        self._request_children: dict[tuple[str, str, int], tuple] = {}

    def observe_request(self, template: str, method: str, status: int, seconds: float) -> None:
        """Count and time one HTTP request by its route template."""
        children = self._request_children.get((template, method, status))
        if children is None:
            children = (
                self.requests.labels(template, method, str(status)),
                self.request_seconds.labels(template, method),
            )
            self._request_children[(template, method, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def on_collect(self, hook: Callable[[], None]) -> None:
        """Run `hook` before each scrape (to refresh gauges from the live registry)."""
        self._collect_hooks.append(hook)

    def render(self) -> bytes:
        for hook in self._collect_hooks:
            hook()
        return generate_latest(self.registry)

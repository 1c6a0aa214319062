"""Every metric the gateway exports, declared in one place and grouped by layer.

Each app owns its own `CollectorRegistry` (no global registry), so several apps in one
process (tests) never collide. Label values are bounded: route names, pool names, endpoint
URLs from configuration or discovery, error codes and kinds; never user data.

Gauges that mirror live state (in-flight, queue depth, health, circuit state) are read at
scrape time through `set_function`, so the request path pays nothing for them. Histograms and
the request counter are the lock-free types of loop_metrics.py; rare events use
prometheus_client's own Counter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from maskgate.gateway.observability.loop_metrics import (
    CounterChild,
    HistogramChild,
    LoopCounter,
    LoopHistogram,
)

# Seconds. Gateway-added time is sub-millisecond; LLM requests run for seconds to minutes.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (5e-5, 1e-4, 2e-4, 3e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.05, 0.1)
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60)
_SYNC_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_SUPPORT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

ROUTE_LABELS = ("chat", "completions", "generate", "models", "other")


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)

        self._requests(r)
        self._admission(r)
        self._upstreams(r)
        self._answers(r)
        self._control(r)

        self._versions: dict[tuple[str, str], str] = {}

        # The request path looks labelled children up here: a dict hit instead of
        # prometheus_client's lock-protected label resolution.
        self._request_children: dict[tuple[str, str], tuple[HistogramChild, HistogramChild]] = {}
        self._status_children: dict[tuple[str, str, int], CounterChild] = {}
        self._resend_hooks: dict[str, Callable[[str], None]] = {}

    def _requests(self, r: CollectorRegistry) -> None:
        """The front door: requests, refusals, readiness and client connections."""
        # The per-request metrics are lock-free Loop* types (see loop_metrics.py).
        self.requests = LoopCounter(
            "maskgate_requests", "Answered requests.", ["route", "pool", "status"], registry=r
        )
        self.request_duration = LoopHistogram(
            "maskgate_request_duration_seconds",
            "Request arrival to the end of the answer.",
            ["route", "pool"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = LoopHistogram(
            "maskgate_overhead_seconds",
            "Time spent in the gateway, not waiting on an upstream or the admission queue.",
            ["route", "pool"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            "maskgate_rejections",
            "Requests refused by the gateway, by error code.",
            ["code"],
            registry=r,
        )
        self.ready = Gauge("maskgate_ready", "1 while the gateway accepts traffic.", registry=r)
        # --- client connections (clients/connections.py) ---
        self.client_connections = Gauge(
            "maskgate_client_connections", "Open client connections.", registry=r
        )
        self.client_connections_closed = Counter(
            "maskgate_client_connections_closed",
            "Client connections the gateway closed, by reason: header_timeout, body_timeout, "
            "idle_timeout, shed_idle (the cap was reached), refused (the cap was reached and "
            "none was idle).",
            ["reason"],
            registry=r,
        )

    def _admission(self, r: CollectorRegistry) -> None:
        """Per pool: admission permits and the queue."""
        self.inflight = Gauge(
            "maskgate_inflight_requests",
            "Requests holding an admission permit.",
            ["pool"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "maskgate_queue_depth", "Requests waiting for a permit.", ["pool"], registry=r
        )
        self.queue_capacity = Gauge(
            "maskgate_queue_capacity", "Longest admission queue allowed.", ["pool"], registry=r
        )
        self.queue_wait = LoopHistogram(
            "maskgate_queue_wait_seconds",
            "Time queued before a permit (0 for requests admitted at once).",
            ["pool"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )

    def _upstreams(self, r: CollectorRegistry) -> None:
        """Per endpoint: health, circuits, faults, retries and re-sends."""
        self.pool_endpoints = Gauge(
            "maskgate_pool_endpoints", "Endpoints known in the pool.", ["pool"], registry=r
        )
        self.upstream_healthy = Gauge(
            "maskgate_upstream_healthy",
            "1 when the endpoint passes health checks.",
            ["pool", "upstream"],
            registry=r,
        )
        self.circuit_state = Gauge(
            "maskgate_upstream_circuit_state",
            "0 closed, 1 half-open, 2 open.",
            ["pool", "upstream"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "maskgate_upstream_errors",
            "Upstream faults by kind (connect, timeout, status_5xx, body).",
            ["pool", "upstream", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "maskgate_retries", "Attempts repeated on another endpoint.", ["pool"], registry=r
        )
        self.policy_offloads = Counter(
            "maskgate_policy_offloads",
            "Inference bodies checked in a worker process (large bodies, large mask batches).",
            registry=r,
        )
        self.stale_resends = Counter(
            "maskgate_upstream_stale_resends",
            "Requests sent again on a new connection after a kept-alive one closed before "
            "any response byte (the upstream may have run them twice).",
            ["pool", "upstream"],
            registry=r,
        )

    def _answers(self, r: CollectorRegistry) -> None:
        """What goes back: streams and mask responses."""
        self.stream_ttfb = LoopHistogram(
            "maskgate_stream_ttfb_seconds",
            "Request arrival to the first streamed chunk sent to the client.",
            ["route", "pool"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stream_errors = Counter(
            "maskgate_stream_errors",
            "Streams ended early by an upstream failure.",
            ["pool"],
            registry=r,
        )

        # --- mask responses ---
        self.mask_support = LoopHistogram(
            "maskgate_mask_support_size",
            "Ids per generated token in returned sampling masks.",
            ["pool"],
            buckets=_SUPPORT_BUCKETS,
            registry=r,
        )
        self.mask_violations = Counter(
            "maskgate_mask_invariant_violations",
            "Mask responses breaking an invariant (mask_count, logprob_count, "
            "token_outside_mask, malformed).",
            ["kind"],
            registry=r,
        )

    def _control(self, r: CollectorRegistry) -> None:
        """The RL control plane (rl/) and several processes on one port (cluster/)."""
        self.sync_duration = LoopHistogram(
            "maskgate_weight_sync_duration_seconds",
            "Fleet-wide weight syncs of the trained pool, pause to continue.",
            ["pool", "kind"],
            buckets=_SYNC_BUCKETS,
            registry=r,
        )
        self.sync_failures = Counter(
            "maskgate_weight_sync_failures",
            "Weight syncs where at least one endpoint failed (it is ejected).",
            ["pool", "kind"],
            registry=r,
        )
        self.sync_endpoint_failures = Counter(
            "maskgate_weight_sync_endpoint_failures",
            "Endpoints that failed a weight sync, by the step that failed "
            "(pause, flush, update, version, continue).",
            ["pool", "stage"],
            registry=r,
        )
        # Info-style: value 1, one series per endpoint at a time (the old one is removed
        # when the version changes), so the labels stay bounded.
        self.endpoint_version = Gauge(
            "maskgate_endpoint_weight_version",
            "1 for the weight version each endpoint of the trained pool reports.",
            ["pool", "upstream", "version"],
            registry=r,
        )
        self.endpoint_stale = Gauge(
            "maskgate_endpoint_weight_stale",
            "1 while the endpoint is out of rotation for missing the pool's weight version.",
            ["pool", "upstream"],
            registry=r,
        )
        self.sync_held = Counter(
            "maskgate_weight_sync_held_requests",
            "Requests that queued because a weight sync or a pause held the pool.",
            ["pool"],
            registry=r,
        )
        self.control_hold_expired = Counter(
            "maskgate_control_hold_expired",
            "Holds of the trained pool (sync, paused, released, leader) released because "
            "they passed control.hold_deadline_s.",
            ["reason"],
            registry=r,
        )
        # --- several processes on one port (cluster/leader.py) ---
        self.control_barrier_timeouts = Counter(
            "maskgate_control_barrier_timeouts",
            "Control-state changes that some gateway process did not acknowledge in time.",
            registry=r,
        )
        self.control_leader_lost = Counter(
            "maskgate_control_leader_lost",
            "Times this process lost the control leader long enough to release its holds.",
            registry=r,
        )

    def observe_request(
        self, route: str, pool: str, status: int, duration: float, overhead: float
    ) -> None:
        key = (route, pool)
        pair = self._request_children.get(key)
        if pair is None:
            pair = self._request_children[key] = (
                self.request_duration.labels(route, pool),
                self.overhead.labels(route, pool),
            )
        pair[0].observe(duration)
        pair[1].observe(overhead)
        skey = (route, pool, status)
        counter = self._status_children.get(skey)
        if counter is None:
            counter = self._status_children[skey] = self.requests.labels(route, pool, str(status))
        counter.inc()

    def stale_resend_hook(self, pool: str) -> Callable[[str], None]:
        """The `on_resend` callback of UpstreamClient.request for one pool: it counts a
        re-send to the endpoint it is given. Made once per pool, so a request builds none."""
        hook = self._resend_hooks.get(pool)
        if hook is None:

            def hook(upstream: str) -> None:
                self.stale_resends.labels(pool, upstream).inc()

            self._resend_hooks[pool] = hook
        return hook

    def watch_pool(
        self,
        pool: str,
        inflight: Callable[[], float],
        depth: Callable[[], float],
        endpoints: Callable[[], float],
        capacity: int,
    ) -> None:
        self.inflight.labels(pool).set_function(inflight)
        self.queue_depth.labels(pool).set_function(depth)
        self.pool_endpoints.labels(pool).set_function(endpoints)
        self.queue_capacity.labels(pool).set(capacity)

    def watch_endpoint(
        self,
        pool: str,
        upstream: str,
        healthy: Callable[[], float],
        circuit: Callable[[], float],
    ) -> None:
        self.upstream_healthy.labels(pool, upstream).set_function(healthy)
        self.circuit_state.labels(pool, upstream).set_function(circuit)

    def set_endpoint_version(self, pool: str, upstream: str, version: str | None) -> None:
        """Move the endpoint's version series to `version` (None: no series)."""
        old = self._versions.pop((pool, upstream), None)
        if old is not None and old != version:
            with contextlib.suppress(KeyError):
                self.endpoint_version.remove(pool, upstream, old)
        if version is not None:
            self._versions[(pool, upstream)] = version
            self.endpoint_version.labels(pool, upstream, version).set(1)

    def forget_endpoint(self, pool: str, upstream: str) -> None:
        """Drop a removed endpoint's series so label sets stay bounded under churn."""
        for gauge in (self.upstream_healthy, self.circuit_state, self.endpoint_stale):
            with contextlib.suppress(KeyError):
                gauge.remove(pool, upstream)
        self.set_endpoint_version(pool, upstream, None)

    def render(self) -> bytes:
        return generate_latest(self.registry)

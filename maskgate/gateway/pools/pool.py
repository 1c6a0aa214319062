"""Named pools of upstream endpoints, their live state, and endpoint selection.

Selection is a small synchronous function (`choose`) that does no I/O and returns an index:
power of two choices over the endpoints that are healthy and whose circuit lets a request
through, preferring the one with fewer outstanding requests.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from maskgate.gateway.config import PoolConfig
from maskgate.gateway.observability.metrics import GatewayMetrics
from maskgate.gateway.pools.admission import Admission
from maskgate.gateway.pools.circuit import CircuitBreaker
from maskgate.gateway.pools.versions import at_least


class Endpoint:
    __slots__ = (
        "circuit",
        "gated",
        "health_fails",
        "health_oks",
        "healthy",
        "outstanding",
        "rejoin",
        "removed",
        "source",
        "stale",
        "url",
        "weight_version",
    )

    def __init__(
        self, url: str, source: str, circuit: CircuitBreaker, checked: bool, gated: bool = False
    ) -> None:
        self.url = url  # "http://10.0.0.7:30000", no trailing slash
        self.source = source  # "static", "dns" or "admin"
        self.circuit = circuit
        # None until the first health check answers (treated as usable unless `gated`);
        # always True when the pool has no active health checks.
        self.healthy: bool | None = None if checked else True
        # Added at run time: unusable until a health check has passed.
        self.gated = gated and checked
        self.health_oks = 0  # consecutive passing checks while unhealthy
        self.health_fails = 0  # consecutive failing checks while healthy
        self.outstanding = 0  # requests sent and not finished
        self.removed = False
        # The trained pool only (docs/rl.md): the version the endpoint last reported, and
        # whether it is out of rotation because it missed or failed a weight sync. `rejoin`:
        # reporting the pool's version brings it back (False after a sync that set no version:
        # only a later sync that succeeds on it, or registering it again, does).
        self.weight_version: str | None = None
        self.stale = False
        self.rejoin = True

    def usable(self) -> bool:
        healthy = self.healthy
        if healthy is None:
            healthy = not self.gated
        return healthy and not self.stale and self.circuit.available()

    def describe(self) -> dict[str, object]:
        return {
            "url": self.url,
            "source": self.source,
            "healthy": self.healthy,
            "outstanding": self.outstanding,
            "circuit": self.circuit.state.name.lower().replace("_", "-"),
            "weight_version": self.weight_version,
            "stale": self.stale,
        }


def choose(endpoints: Sequence[Endpoint], exclude: Sequence[Endpoint], rng: random.Random) -> int:
    """Index of the endpoint to use, or -1 when none is usable (power of two choices)."""
    if len(endpoints) == 1:  # the common small-pool case, without building a list
        return 0 if endpoints[0].usable() and endpoints[0] not in exclude else -1
    candidates = [i for i, ep in enumerate(endpoints) if ep.usable() and ep not in exclude]
    if len(candidates) < 2:
        return candidates[0] if candidates else -1
    a, b = rng.sample(candidates, 2)
    return a if endpoints[a].outstanding <= endpoints[b].outstanding else b


class Pool:
    def __init__(
        self,
        name: str,
        cfg: PoolConfig,
        metrics: GatewayMetrics,
        *,
        rng: random.Random | None = None,
        trained: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.metrics = metrics
        self.endpoints: list[Endpoint] = []
        self.admission = Admission(cfg.max_concurrency, cfg.max_queue, cfg.queue_timeout_s)
        self.admission.on_held = metrics.sync_held.labels(name).inc
        self.vocab_size: int | None = None  # from a healthy endpoint's /get_model_info
        # The RL control plane (weight_sync.py): whether trainers' control calls act on this
        # pool, the version its last sync installed (None: no sync through this gateway yet),
        # and a counter bumped by every sync, so a version read that raced one is dropped.
        self.trained = trained
        self.version: str | None = None
        self.sync_epoch = 0
        # Several gateway processes: this process mirrors the leader's versions and stale
        # flags instead of deciding them from its own health checks (leader.py).
        self.mirrored = False
        self.queue_wait = metrics.queue_wait.labels(name)  # bound once: the request path uses it
        self._rng = rng or random.Random()
        self._clock = clock or time.monotonic
        metrics.watch_pool(
            name,
            inflight=lambda: self.admission.active,
            depth=lambda: self.admission.depth,
            endpoints=lambda: len(self.endpoints),
            capacity=cfg.max_queue,
        )
        for url in cfg.endpoints:
            self.add(url, "static")

    def add(self, url: str, source: str, *, gated: bool = False) -> Endpoint | None:
        """Add an endpoint; None when the URL is already in the pool. `gated`: no traffic
        before its first passing health check (endpoints added at run time)."""
        if any(ep.url == url for ep in self.endpoints):
            return None
        breaker = CircuitBreaker(
            self.cfg.circuit.failure_threshold, self.cfg.circuit.open_s, self._clock
        )
        ep = Endpoint(url, source, breaker, self.cfg.health_path is not None, gated)
        # After a sync, a newcomer serves only once it reports the pool's version.
        ep.stale = self.version is not None
        # A new list, never an in-place change: loops iterating the old one stay valid.
        self.endpoints = [*self.endpoints, ep]
        self.metrics.watch_endpoint(
            self.name,
            url,
            healthy=lambda: (
                0.0 if ep.healthy is False or (ep.healthy is None and ep.gated) else 1.0
            ),
            circuit=ep.circuit.reading,
        )
        if self.trained:
            self.metrics.endpoint_stale.labels(self.name, url).set_function(
                lambda: 1.0 if ep.stale else 0.0
            )
        return ep

    def remove(self, url: str) -> Endpoint | None:
        """Remove an endpoint; requests already sent to it finish normally."""
        for ep in self.endpoints:
            if ep.url == url:
                ep.removed = True
                self.endpoints = [e for e in self.endpoints if e is not ep]
                self.metrics.forget_endpoint(self.name, url)
                return ep
        return None

    def pick(
        self, exclude: Sequence[Endpoint] = (), min_version: str | None = None
    ) -> Endpoint | None:
        """An endpoint to send a request to; with `min_version`, only among those at or above
        it (versions.at_least)."""
        endpoints = self.endpoints
        if min_version is not None:
            endpoints = [ep for ep in endpoints if at_least(ep.weight_version, min_version)]
        i = choose(endpoints, exclude, self._rng)
        return None if i < 0 else endpoints[i]

    def has_usable(self, min_version: str | None = None) -> bool:
        if min_version is None:
            return any(ep.usable() for ep in self.endpoints)
        return any(
            ep.usable() and at_least(ep.weight_version, min_version) for ep in self.endpoints
        )

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "endpoints": [ep.describe() for ep in self.endpoints],
            "inflight": self.admission.active,
            "queued": self.admission.depth,
            "max_concurrency": self.cfg.max_concurrency,
            "max_queue": self.cfg.max_queue,
            "dns": self.cfg.dns,
            "vocab_size": self.vocab_size,
            "trained": self.trained,
            "weight_version": self.version,
        }

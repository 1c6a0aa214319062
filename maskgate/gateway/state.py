"""The state one gateway app shares between its handlers and background tasks.

Kept under a typed `web.AppKey` (no module globals), so several apps can live in one
process, as they do in tests.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from maskgate.gateway.config import GatewayConfig
from maskgate.protocol.policy import PolicyConfig

if TYPE_CHECKING:  # annotations only: the parts the state holds live in wings that import it
    from maskgate.gateway.clients.connections import ConnectionGuard
    from maskgate.gateway.observability.metrics import GatewayMetrics
    from maskgate.gateway.pools.pool import Pool
    from maskgate.gateway.proxy.bodycheck import BodyChecker
    from maskgate.gateway.upstream.client import UpstreamClient

# (host, port) -> the addresses it resolves to right now (IPv4 or IPv6 literals).
Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(eq=False)
class GatewayState:
    config: GatewayConfig
    policy: PolicyConfig
    metrics: GatewayMetrics
    pools: dict[str, Pool]
    resolver: Resolver | None = None  # None: the event loop's getaddrinfo
    upstream: UpstreamClient | None = None  # set by the cleanup context
    # Client connection bounds; in force where serve.py's GuardedRunner serves the app.
    connections: ConnectionGuard | None = None
    draining: bool = False  # SIGTERM seen: readiness fails, in-flight work finishes
    started: bool = False  # the first round of health checks has answered
    api_keys: frozenset[str] = field(default_factory=frozenset)
    mask_allow_keys: frozenset[str] | None = None
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    # Callers that reach the control plane without the admin key; `insecure_control`: anyone.
    trusted_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    insecure_control: bool = False
    checker: BodyChecker | None = None  # set by create_app
    # Request ids: 16 random hex digits per app, then a counter (32 hex digits in all, like a
    # uuid4's hex), so the request path makes no system call for randomness.
    _rid_prefix: str = field(default_factory=lambda: os.urandom(8).hex())
    _rid_counter: itertools.count[int] = field(default_factory=itertools.count)

    def new_request_id(self) -> str:
        return f"{self._rid_prefix}{next(self._rid_counter):016x}"

    @property
    def ready(self) -> bool:
        return self.started and not self.draining

    def client(self) -> UpstreamClient:
        assert self.upstream is not None, "upstream client used outside the app's lifetime"
        return self.upstream


STATE = web.AppKey("maskgate_state", GatewayState)

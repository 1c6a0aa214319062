"""The route table: every path each gateway app serves, declared once, and nothing else.

A row is `(methods, path, handler, access, forwarded_to_leader)` (`Row`). `create_app`
registers exactly the rows of its app and wraps each with its access group's check
(access.py); any other path answers 404 `not_found` and any other method on a declared path
405 `method_not_allowed`, from the gateway itself: nothing undeclared reaches an upstream.
The OpenAPI document (openapi.py) and the paths a follower process forwards to the control
leader (cluster/leader_middleware.py) are read from the same rows.

Proxied rows send the row's own upstream path (never the client's spelling of it) and
classify every body that carries sampling parameters with the mask policy, whatever the
method. SGLang serves more routes than these; docs/gateway.md lists each and why it is
served, answered here, or 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from maskgate.gateway.api import probes
from maskgate.gateway.clients.access import Access
from maskgate.gateway.cluster.leader_middleware import LeaderPaths
from maskgate.gateway.config import GatewayConfig
from maskgate.gateway.proxy.handler import proxied
from maskgate.gateway.rl import admin, control, registration
from maskgate.protocol.policy import Route

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC, CLIENT, CONTROL, ADMIN = Access.PUBLIC, Access.CLIENT, Access.CONTROL, Access.ADMIN


@dataclass(frozen=True)
class Row:
    methods: tuple[str, ...]
    path: str  # an aiohttp path: `{name}` or `{name:regex}` for a variable part
    handler: Handler
    access: Access
    forwarded_to_leader: bool = False
    upstream: str | None = None  # proxied rows: the path sent upstream (documentation)
    policy: Route | None = None  # proxied rows: the mask-policy route, None: no sampling
    documented: bool = True  # listed in the OpenAPI document


def _proxied(
    methods: tuple[str, ...], path: str, label: str, policy: Route | None, upstream: str = ""
) -> Row:
    upstream = upstream or path
    handler = proxied(label, policy, upstream)
    return Row(methods, path, handler, CLIENT, upstream=upstream, policy=policy)


# The inference rows, the hot path: plain paths, found by one dict lookup in aiohttp's router.
PROXIED = (
    _proxied(("POST",), "/v1/chat/completions", "chat", Route.CHAT),
    _proxied(("POST",), "/v1/completions", "completions", Route.COMPLETIONS),
    _proxied(("POST", "PUT"), "/generate", "generate", Route.GENERATE),
    # SageMaker's route for chat completions, as SGLang serves it: the same body.
    _proxied(("POST",), "/invocations", "chat", Route.CHAT, "/v1/chat/completions"),
    _proxied(("GET",), "/v1/models", "models", None),
    # No sampling parameters: proxied to the general pool without the mask policy.
    _proxied(("POST",), "/v1/embeddings", "other", None),
    *(
        _proxied(("POST",), path, "other", None)
        for path in ("/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize")
    ),
)

_PROBES = (
    Row(("GET",), "/healthz", probes.healthz, PUBLIC),
    Row(("GET",), "/readyz", probes.readyz, PUBLIC),
    Row(("GET",), "/ping", probes.healthz, PUBLIC),  # SageMaker's liveness path
)
_OPENAPI = Row(("GET",), "/openapi.json", probes.openapi_json, PUBLIC)


def _control() -> tuple[Row, ...]:
    """SGLang's RL control paths, acting on the whole trained pool (control.py)."""
    rows = [Row(("POST",), p, h, CONTROL, True) for p, h in control.POST_HANDLERS.items()]
    rows += [
        Row(("GET", "POST"), p, h, CONTROL, True) for p, h in control.GET_OR_POST_HANDLERS.items()
    ]
    # Reads: what any client of the pool may know (versions, ranks, model info).
    rows += [Row(("GET",), p, h, CLIENT, True) for p, h in control.GET_HANDLERS.items()]
    return tuple(rows)


_REGISTRATION = (
    Row(("POST",), "/workers", registration.add_worker, CONTROL, True),
    Row(("GET",), "/workers", registration.list_workers, CONTROL, True),
    Row(("GET",), "/workers/{worker_id:.+}", registration.get_worker, CONTROL, True),
    Row(("DELETE",), "/workers/{worker_id:.+}", registration.delete_worker, CONTROL, True),
    Row(("POST",), "/add_worker", registration.legacy_add, CONTROL, True),
    Row(("POST",), "/remove_worker", registration.legacy_remove, CONTROL, True),
    Row(("GET",), "/list_workers", registration.legacy_list, CONTROL, True),
)
_LOADS = (
    Row(("GET",), "/v1/loads", registration.loads, CLIENT),
    Row(("GET",), "/get_loads", registration.loads, CLIENT),
)
_ADMIN = (
    Row(("GET",), "/admin/pools", admin.list_pools, ADMIN, True),
    Row(("POST",), "/admin/pools/{pool}/endpoints", admin.add_endpoints, ADMIN, True),
    Row(("DELETE",), "/admin/pools/{pool}/endpoints", admin.remove_endpoints, ADMIN, True),
)
_ANY = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
# Without admin_key the admin API is off on the traffic port: its paths say so (404).
_ADMIN_OFF = (
    Row(_ANY, "/admin", admin.admin_disabled, PUBLIC, documented=False),
    Row(_ANY, "/admin/{tail:.*}", admin.admin_disabled, PUBLIC, documented=False),
)


def main_table(config: GatewayConfig) -> tuple[Row, ...]:
    """The traffic port's rows under `config`."""
    rows = [*PROXIED, *_PROBES]
    if config.metrics_port is None:  # it lists upstream URLs: a client key when keys are set
        rows.append(Row(("GET",), "/metrics", probes.metrics_handler, CLIENT))
    rows.append(_OPENAPI)
    if config.control_enabled():
        rows += [*_control(), *_REGISTRATION]
    rows += _LOADS
    rows += _ADMIN if config.admin_key is not None else _ADMIN_OFF
    return tuple(rows)


def probe_table() -> tuple[Row, ...]:
    """The `metrics_port` listener's rows."""
    return (*_PROBES, Row(("GET",), "/metrics", probes.metrics_handler, PUBLIC))


def admin_table() -> tuple[Row, ...]:
    """The loopback `admin_port` listener's rows (open there when no admin_key is set)."""
    return (*_ADMIN, *_REGISTRATION)


def leader_paths(rows: tuple[Row, ...]) -> LeaderPaths:
    """The exact paths and path prefixes of the rows forwarded to the control leader, and
    the control paths whose GET changes state too."""
    forwarded = [row.path for row in rows if row.forwarded_to_leader]
    exact = frozenset(p for p in forwarded if "{" not in p)
    prefixes = tuple(sorted({p.partition("{")[0] for p in forwarded if "{" in p}))
    return LeaderPaths(exact, prefixes, control.CHANGING_GET_PATHS)

"""Who may call a row of the route table (routes.py): its access level, checked once per
request by the row's wrapper (app.py), before the handler runs.

- `public`: anyone (probes, the API description).
- `client`: a client key from `api_keys`, or the admin key; open when no `api_keys` are set.
- `control`: the RL control plane and worker registration. The admin key, or a caller whose
  address is inside `trusted_networks` (loopback by default); anyone with
  `insecure_control: true`.
- `admin`: the admin key only. Without one the rows exist only on the loopback `admin_port`
  listener, which is open.

The caller's address is the TCP peer's. Behind a peer listed in `trusted_proxies` it is the
right-most `X-Forwarded-For` hop that is not itself a trusted proxy (the hop that proxy saw;
hops further left are the client's own claims). A request that a follower process forwards
to the control leader over its private unix socket carries the address the follower saw
(`PEER_HEADER`, set by the follower, read only on a unix socket).
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Callable, Sequence
from enum import StrEnum

from aiohttp import web

from maskgate.gateway.auth import authenticate, bearer_token, check_admin
from maskgate.gateway.state import STATE
from maskgate.protocol.errors import ApiError

PEER_HEADER = "X-Maskgate-Peer"
# A client row's key, set by its access check (None: no keys configured, or the admin key).
API_KEY: web.RequestKey[str | None] = web.RequestKey("maskgate_api_key")


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def is_trusted(peer: str | None, networks: Sequence[Network]) -> bool:
    if not networks or not peer:
        return False
    try:
        addr = ipaddress.ip_address(peer.partition("%")[0])  # drop an IPv6 zone id
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr in net for net in networks)


class Access(StrEnum):
    PUBLIC = "public"
    CLIENT = "client"
    CONTROL = "control"
    ADMIN = "admin"


def _admin_token(request: web.Request, admin_key: str | None) -> bool:
    if admin_key is None:
        return False
    token = bearer_token(request.headers) or request.headers.get("X-Admin-Key")
    return token is not None and hmac.compare_digest(token.encode(), admin_key.encode())


def check_client(request: web.Request) -> None:
    """Sets the caller's client key (None: no keys configured, or the admin key)."""
    state = request.app[STATE]
    if state.api_keys and _admin_token(request, state.config.admin_key):
        request[API_KEY] = None
    else:
        request[API_KEY] = authenticate(request.headers, state.api_keys)


def check_control(request: web.Request) -> None:
    state = request.app[STATE]
    if state.insecure_control or _admin_token(request, state.config.admin_key):
        return
    address = client_address(request, state.trusted_proxies)
    if is_trusted(address, state.trusted_networks):
        return
    if state.config.admin_key is not None:
        raise ApiError(
            "invalid_admin_key",
            f"the control plane needs the admin key ('Authorization: Bearer <admin key>') "
            f"from {address or 'this address'}, which is outside trusted_networks",
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    raise ApiError(
        "control_forbidden",
        f"the control plane answers callers inside trusted_networks only, and "
        f"{address or 'this address'} is not; set admin_key, or add the caller's network "
        "to trusted_networks",
        status=403,
    )


def check_admin_key(request: web.Request) -> None:
    check_admin(request.headers, request.app[STATE].config.admin_key)


CHECKS: dict[Access, Callable[[web.Request], None] | None] = {
    Access.PUBLIC: None,
    Access.CLIENT: check_client,
    Access.CONTROL: check_control,
    Access.ADMIN: check_admin_key,
}


def client_address(request: web.Request, proxies: Sequence[Network]) -> str:
    """The caller's address, as the module docstring defines it ("" when unknown)."""
    if _on_unix_socket(request):
        return request.headers.get(PEER_HEADER, "")
    peer = request.remote or ""
    if not proxies or not is_trusted(peer, proxies):
        return peer
    hops = [
        hop.strip()
        for value in request.headers.getall("X-Forwarded-For", ())
        for hop in value.split(",")
        if hop.strip()
    ]
    for hop in reversed(hops):
        if not is_trusted(hop, proxies):
            return hop
    return hops[0] if hops else peer


def _on_unix_socket(request: web.Request) -> bool:
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock is not None and sock.family == socket.AF_UNIX


def networks(values: Sequence[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) for n in values)

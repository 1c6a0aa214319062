"""Which endpoint URLs the admin API refuses (unless `admin_allow_unsafe_urls` is set).

An endpoint receives the traffic of its pool, clients' headers included, so a URL added at
run time must not point the gateway at something it should never talk to:

- URLs with credentials (`http://user:pass@host`): they would be sent to every request's
  upstream connection and show up in pool listings and metrics labels;
- link-local addresses (169.254.0.0/16, fe80::/10, IPv4-mapped too), where cloud metadata
  services live;
- the other well-known cloud metadata addresses and names (`_METADATA_*`).

A host name is resolved once, when it is added, and every address it has must pass. A name
whose records change later is not checked again (DNS discovery pools are configuration, and
trusted the same way as static endpoints).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from maskgate.gateway.pools.discovery import resolve_addresses
from maskgate.gateway.state import GatewayState
from maskgate.protocol.errors import ApiError

_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, ...
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IPv6 metadata
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server
        "192.0.0.192",  # Oracle Cloud (classic)
    )
)
_METADATA_NAMES = frozenset(
    {"metadata", "metadata.google.internal", "metadata.azure.internal", "instance-data"}
)
_RESOLVE_TIMEOUT_S = 2.0


def unsafe_address(text: str) -> str | None:
    """Why this IP literal may not be an endpoint, or None."""
    try:
        addr = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr in _METADATA_ADDRESSES:
        return f"{addr} is a cloud metadata address"
    if addr.is_link_local:
        return f"{addr} is a link-local address"
    return None


async def check_endpoint_url(state: GatewayState, url: str) -> None:
    """Raise 400 `unsafe_endpoint` when `url` (already normalised) may not be added."""
    if state.config.admin_allow_unsafe_urls:
        return
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise _unsafe(url, "it carries credentials (user:password@)")
    host = (parts.hostname or "").rstrip(".").lower()
    if host in _METADATA_NAMES:
        raise _unsafe(url, f"{host} is a cloud metadata host name")
    reason = unsafe_address(host)
    if reason is None and _is_name(host):
        resolver = state.resolver or resolve_addresses
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            async with asyncio.timeout(_RESOLVE_TIMEOUT_S):
                addresses = await resolver(host, port)
        except (OSError, TimeoutError, socket.gaierror) as e:
            raise ApiError(
                "invalid_endpoint", f"{url}: {host} does not resolve ({e})", param="url"
            ) from e
        reason = next(filter(None, map(unsafe_address, addresses)), None)
        if reason is not None:
            reason = f"{host} resolves to {reason}"
    if reason is not None:
        raise _unsafe(url, reason)


def _is_name(host: str) -> bool:
    try:
        ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return True
    return False


def _unsafe(url: str, why: str) -> ApiError:
    return ApiError(
        "unsafe_endpoint",
        f"refusing endpoint {url}: {why}; set admin_allow_unsafe_urls to allow it",
        param="url",
    )

"""DNS discovery: a name (for example a Kubernetes headless Service) re-resolved on an
interval; every A/AAAA address becomes an endpoint `{dns_scheme}://addr:{dns_port}`.

Endpoints that leave the record set are removed (requests already sent to them finish);
new ones are added. A failed lookup keeps the last known set: a DNS hiccup must not empty
the pool, and endpoints that really went away fail their health checks anyway.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from maskgate.gateway.pools.pool import Pool
from maskgate.gateway.state import Resolver

LOG = logging.getLogger("maskgate.discovery")


async def resolve_addresses(host: str, port: int) -> list[str]:
    """Every address of `host`, IPv4 and IPv6, through the event loop's getaddrinfo."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def endpoint_url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


async def refresh(pool: Pool, resolver: Resolver) -> bool:
    """Resolve once and reconcile the pool's DNS endpoints; False when the lookup failed."""
    cfg = pool.cfg
    assert cfg.dns is not None
    try:
        addresses = await resolver(cfg.dns, cfg.dns_port)
    except (OSError, TimeoutError) as e:
        LOG.warning("lookup of %s failed: %s", cfg.dns, e, extra={"pool": pool.name})
        return False
    wanted = {endpoint_url(cfg.dns_scheme, a, cfg.dns_port) for a in addresses}
    have = {ep.url for ep in pool.endpoints if ep.source == "dns"}
    for url in sorted(wanted - have):
        if pool.add(url, "dns") is not None:
            LOG.info("endpoint added", extra={"pool": pool.name, "upstream": url})
    for url in sorted(have - wanted):
        pool.remove(url)
        LOG.info("endpoint removed", extra={"pool": pool.name, "upstream": url})
    return True


async def discovery_loop(pool: Pool, resolver: Resolver) -> None:
    while True:
        await asyncio.sleep(pool.cfg.dns_interval_s)
        try:
            await refresh(pool, resolver)
        except Exception:  # keep discovering whatever one round did
            LOG.exception("discovery round failed", extra={"pool": pool.name})

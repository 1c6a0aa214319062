"""DNS discovery follows changed records: every address is an endpoint on the pool's port.

The injected resolver stands in for DNS; the upstreams are real servers on loopback
addresses 127.0.0.1 and 127.0.0.2 sharing one port, exactly as pods behind a headless
Service share their port.
"""

from __future__ import annotations

import errno
import socket

import pytest

pytestmark = pytest.mark.integration


async def two_hosts_one_port(upstreams):
    for _ in range(20):
        a = await upstreams(name="a", host="127.0.0.1")
        port = int(a.url.rsplit(":", 1)[1])
        try:
            b = await upstreams(name="b", host="127.0.0.2", port=port)
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                await a.stop()
                continue
            raise
        return a, b, port
    pytest.skip("no loopback port free on both 127.0.0.1 and 127.0.0.2")


async def test_discovery_follows_changed_records(upstreams, gateway, make_config, until):
    a, b, port = await two_hosts_one_port(upstreams)
    records = {"mask.workers.test": ["127.0.0.1"]}
    lookups: list[str] = []

    async def resolver(host: str, p: int) -> list[str]:
        lookups.append(host)
        assert p == port
        if host not in records:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return records[host]

    config = make_config(
        [],
        [],
        pools={"mask": {"dns": "mask.workers.test", "dns_port": port, "dns_interval_s": 0.05}},
    )
    body = {"text": "x", "return_sampling_mask": True, "sampling_params": {"top_k": 2}}
    async with gateway(config, resolver=resolver) as gw:
        pool = gw.state.pools["mask"]
        assert [ep.url for ep in pool.endpoints] == [f"http://127.0.0.1:{port}"]
        for _ in range(3):
            assert (await gw.post("/generate", body))[0] == 200
        assert len(a.requests) == 3 and b.requests == []

        records["mask.workers.test"] = ["127.0.0.1", "127.0.0.2"]  # scale up
        await until(lambda: len(pool.endpoints) == 2)
        records["mask.workers.test"] = ["127.0.0.2"]  # the first pod goes away
        await until(lambda: [ep.url for ep in pool.endpoints] == [f"http://127.0.0.2:{port}"])
        for _ in range(3):
            assert (await gw.post("/generate", body))[0] == 200
        assert len(a.requests) == 3 and len(b.requests) == 3

        del records["mask.workers.test"]  # lookups fail: keep the last known endpoints
        n = len(lookups)
        await until(lambda: len(lookups) > n + 2)
        assert [ep.url for ep in pool.endpoints] == [f"http://127.0.0.2:{port}"]
        text = await gw.metrics()
    assert 'maskgate_pool_endpoints{pool="mask"} 1.0' in text
    assert f'upstream="http://127.0.0.1:{port}"' not in text  # removed endpoints leave no series


async def test_ipv6_addresses_become_bracketed_urls():
    from maskgate.gateway.pools.discovery import endpoint_url

    assert endpoint_url("http", "fd00::7", 30000) == "http://[fd00::7]:30000"
    assert endpoint_url("https", "10.1.2.3", 8000) == "https://10.1.2.3:8000"

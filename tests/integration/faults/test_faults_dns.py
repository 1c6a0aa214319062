"""DNS records that change. The gateway re-resolves a pool's name on an interval through
the system resolver; the CLI has no resolver hook, so the test gives the gateway process
its own /etc/hosts (a private mount namespace, `unshare -m`) and rewrites that file.
Upstreams listen on distinct loopback addresses sharing one port, as pods behind a
headless Service do. Where mount namespaces are unavailable the test skips; the admin API
case below covers endpoint churn everywhere."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import aiohttp
import pytest
from faults_harness import (
    ADMIN_HEADERS,
    CHAT,
    GatewayProc,
    Procs,
    Stream,
    assert_no_leak,
    gateway_config,
    mount_namespace_wrapper,
    wait_until,
)

pytestmark = pytest.mark.integration

NAME = "maskgate-general.test"
ADDRS = ("127.0.0.5", "127.0.0.6", "127.0.0.7")


def _write_hosts(path: Path, addrs: tuple[str, ...]) -> None:
    # One write into the same inode (the bind mount follows the inode, not the name).
    with path.open("r+") as f:
        f.truncate(0)
        f.write("127.0.0.1 localhost\n" + "".join(f"{a} {NAME}\n" for a in addrs))


async def _endpoints(gw: GatewayProc, pool: str = "general") -> set[str]:
    _, body = await gw.get("/admin/pools")
    return {ep["url"] for p in body["pools"] if p["name"] == pool for ep in p["endpoints"]}


def _free_port_on(addrs: tuple[str, ...]) -> int:
    """A port free on every address (bind-and-release; the upstreams take it next)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addrs[0], 0))
            port = s.getsockname()[1]
        try:
            for a in addrs[1:]:
                with socket.socket() as s:
                    s.bind((a, port))
        except OSError:
            continue
        return port
    raise AssertionError("no common free port")


async def test_dns_record_changes_move_traffic_and_spare_in_flight_streams(
    procs: Procs, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    wrapper = mount_namespace_wrapper()
    if wrapper is None:
        pytest.skip("no mount namespaces here (unshare -m): cannot inject DNS records")
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    _write_hosts(hosts, ADDRS[:1])
    port = _free_port_on(ADDRS)
    a, b, c = (procs.upstream(host=h, port=port, chunks=15, chunk_gap_s=0.1) for h in ADDRS)
    other = procs.upstream()
    cfg = gateway_config([], [other.url])
    cfg["pools"]["general"] = {"dns": NAME, "dns_port": port, "dns_interval_s": 0.2}
    gw = await procs.gateway(cfg, wrap=[*wrapper, str(hosts)])
    assert await _endpoints(gw) == {a.url}
    async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
    assert await a.count() == 1
    before = gw.resources()

    # a -> b while a stream runs on a: the stream finishes, new requests go to b.
    async with client.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        stream = Stream(r)
        await stream.next_events(1)
        _write_hosts(hosts, ADDRS[1:2])
        await wait_until(lambda: _has(gw, {b.url}), timeout=5.0, what="record a -> b")
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200
        assert await b.count() == 1
        rest = await stream.rest()
    assert rest[-1] == "[DONE]" and stream.error is None

    # b -> {b, c}: both serve.
    _write_hosts(hosts, ADDRS[1:])
    await wait_until(lambda: _has(gw, {b.url, c.url}), timeout=5.0, what="record b -> b, c")
    for _ in range(20):
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200
    assert await b.count() > 1 and await c.count() > 0
    assert await a.count() == 2  # the first request and the stream; nothing since
    assert await gw.metric("maskgate_pool_endpoints", pool="general") == 2

    # The name disappears (lookup fails): the last known set is kept, traffic flows.
    _write_hosts(hosts, ())
    for _ in range(5):
        async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200
    assert await _endpoints(gw) == {b.url, c.url}
    assert gw.alive()
    # The two endpoints added since the baseline may each hold two idle keep-alive
    # connections (requests and health checks); a removed endpoint's are swept.
    await assert_no_leak(gw, before, slack=4 + 2 * 2)


async def _has(gw: GatewayProc, urls: set[str]) -> bool:
    return await _endpoints(gw) == urls


async def test_admin_api_endpoint_churn_moves_traffic(
    procs: Procs, client: aiohttp.ClientSession
) -> None:
    a, b = procs.upstream(chunks=15, chunk_gap_s=0.1), procs.upstream()
    gw = await procs.gateway(gateway_config([a.url], []))
    admin = gw.url + "/admin/pools/general/endpoints"
    before = gw.resources()
    async with client.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        stream = Stream(r)
        await stream.next_events(1)
        async with client.post(admin, json={"url": b.url}, headers=ADMIN_HEADERS) as resp:
            assert resp.status == 201
        async with client.delete(admin, json={"url": a.url}, headers=ADMIN_HEADERS) as resp:
            assert resp.status == 200
        assert await _endpoints(gw) == {b.url}
        for _ in range(3):
            async with client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200
        rest = await stream.rest()
    assert rest[-1] == "[DONE]"  # removal spares the request already sent
    assert await a.count() == 1 and await b.count() == 3
    assert os.getpid() != gw.proc.pid and gw.alive()
    await assert_no_leak(gw, before)

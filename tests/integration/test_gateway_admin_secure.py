"""The admin API and /metrics, secure by default: no admin API without a key or a
loopback listener, runtime endpoints gated on a health check, unsafe URLs refused, and
/metrics behind the client keys on the traffic port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from fakes.bodies import MASK_CHAT
from fakes.serve import serve_app

from maskgate.gateway.app import create_admin_app
from maskgate.protocol.settings import ConfigError

pytestmark = pytest.mark.integration


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def add_mask_endpoint(gw: Any, url: str) -> tuple[int, Any]:
    """POST /admin/pools/mask/endpoints with admin key "adm"."""
    async with gw.client.post(
        gw.url + "/admin/pools/mask/endpoints", json={"url": url}, headers=bearer("adm")
    ) as resp:
        return resp.status, await resp.json()


@contextlib.asynccontextmanager
async def admin_listener(main: web.Application) -> AsyncIterator[str]:
    """The `admin_port` listener as serve.py starts it, on 127.0.0.1 and a free port."""
    async with serve_app(create_admin_app(main)) as url:
        yield url


async def test_no_admin_api_by_default(upstreams, gateway, make_config):
    general = await upstreams()
    rogue = await upstreams()
    async with gateway(make_config([general.url], [])) as gw:
        for method, path in (
            ("GET", "/admin/pools"),
            ("POST", "/admin/pools/mask/endpoints"),
            ("DELETE", "/admin/pools/general/endpoints"),
            ("GET", "/admin"),
        ):
            async with gw.client.request(method, gw.url + path, json={"url": rogue.url}) as resp:
                body = await resp.json()
                assert (resp.status, body["error"]["code"]) == (404, "admin_api_disabled")
        assert [ep.url for ep in gw.state.pools["mask"].endpoints] == []
    assert general.requests == []  # never proxied upstream either


async def test_admin_port_is_a_loopback_listener(upstreams, gateway, make_config):
    rollout = await upstreams()
    async with gateway(make_config([], [])) as gw, admin_listener(gw.app) as admin:
        async with gw.client.post(
            admin + "/admin/pools/mask/endpoints", json={"url": rollout.url}
        ) as resp:
            assert resp.status == 201
        async with gw.client.get(admin + "/admin/pools") as resp:
            pools = {p["name"]: p for p in (await resp.json())["pools"]}
        assert pools["mask"]["endpoints"][0]["url"] == rollout.url
    with pytest.raises(ConfigError, match="admin_host must be a loopback address"):
        make_config(admin_port=9000, admin_host="0.0.0.0")
    make_config(admin_port=9000, admin_host="::1")


async def test_admin_port_still_takes_the_admin_key_when_set(upstreams, gateway, make_config):
    async with gateway(make_config([], [], admin_key="adm")) as gw, admin_listener(gw.app) as admin:
        async with gw.client.get(admin + "/admin/pools") as resp:
            assert resp.status == 401
        async with gw.client.get(admin + "/admin/pools", headers=bearer("adm")) as resp:
            assert resp.status == 200


async def test_runtime_endpoints_take_no_traffic_before_a_passing_check(
    upstreams, gateway, make_config, until
):
    rollout = await upstreams(healthy=False)
    async with gateway(make_config([], [], admin_key="adm")) as gw:
        status, body = await add_mask_endpoint(gw, rollout.url)
        assert status == 201
        assert body["pool"]["endpoints"][0]["healthy"] is False  # its first check failed
        status, answer, _ = await gw.post("/v1/chat/completions", MASK_CHAT)
        assert (status, answer["error"]["code"]) == (503, "mask_pool_unavailable")
        assert rollout.requests == []
        # Healthy again: in rotation after healthy_threshold passing checks.
        rollout.healthy = True
        await until(lambda: gw.state.pools["mask"].has_usable())
        status, _, _ = await gw.post("/v1/chat/completions", MASK_CHAT)
        assert status == 200
    assert len(rollout.requests) == 1


async def test_a_healthy_runtime_endpoint_is_usable_when_the_add_answers(
    upstreams, gateway, make_config
):
    rollout = await upstreams()
    async with gateway(make_config([], [], admin_key="adm")) as gw:
        _, body = await add_mask_endpoint(gw, rollout.url)
        assert body["pool"]["endpoints"][0]["healthy"] is True
        status, _, _ = await gw.post("/v1/chat/completions", MASK_CHAT)
        assert status == 200


async def _resolver(host: str, port: int) -> list[str]:
    return {"rebind.test": ["10.0.0.1", "169.254.169.254"], "ok.test": ["127.0.0.1"]}[host]


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pass@127.0.0.1:1",
        "http://user@127.0.0.1:1",
        "http://169.254.169.254",
        "http://169.254.10.1:8080",
        "http://[fe80::1]:80",
        "http://[::ffff:169.254.169.254]:80",
        "http://100.100.100.200",
        "http://[fd00:ec2::254]",
        "http://metadata.google.internal",
        "http://rebind.test:80",
    ],
)
async def test_unsafe_endpoint_urls_are_refused(gateway, make_config, url):
    async with gateway(make_config([], [], admin_key="adm"), resolver=_resolver) as gw:
        async with gw.client.post(
            gw.url + "/admin/pools/general/endpoints", json={"url": url}, headers=bearer("adm")
        ) as resp:
            body = await resp.json()
            assert (resp.status, body["error"]["code"]) == (400, "unsafe_endpoint")
        assert gw.state.pools["general"].endpoints == []


async def test_unsafe_urls_pass_when_allowed(gateway, make_config):
    config = make_config([], [], admin_key="adm", admin_allow_unsafe_urls=True)
    async with (
        gateway(config, resolver=_resolver) as gw,
        gw.client.post(
            gw.url + "/admin/pools/general/endpoints",
            json={"urls": ["http://169.254.169.254", "http://rebind.test:80"]},
            headers=bearer("adm"),
        ) as resp,
    ):
        assert resp.status == 201


async def test_metrics_on_the_traffic_port_take_a_key_when_keys_are_set(
    upstreams, gateway, make_config
):
    general = await upstreams()
    config = make_config([general.url], [], api_keys=["k"], admin_key="adm")
    async with gateway(config) as gw:
        async with gw.client.get(gw.url + "/metrics") as resp:
            body = await resp.json()
            assert (resp.status, body["error"]["code"]) == (401, "missing_api_key")
        for key in ("k", "adm"):
            async with gw.client.get(gw.url + "/metrics", headers=bearer(key)) as resp:
                assert resp.status == 200
                assert general.url in await resp.text()
    async with gateway(make_config([general.url], [])) as gw:  # no keys: open, as before
        status, _ = await _get(gw, "/metrics")
        assert status == 200


async def _get(gw, path: str) -> tuple[int, str]:
    async with gw.client.get(gw.url + path) as resp:
        return resp.status, await resp.text()


async def test_unknown_admin_paths_are_never_proxied(upstreams, gateway, make_config):
    general = await upstreams()
    async with gateway(make_config([general.url], [], admin_key="adm")) as gw:
        for method, path, status, code in (
            ("GET", "/admin/pools/mask/endpoints", 405, "method_not_allowed"),
            ("POST", "/admin/other", 404, "not_found"),
        ):
            async with gw.client.request(method, gw.url + path, headers=bearer("adm")) as resp:
                body = await resp.json()
                assert (resp.status, body["error"]["code"]) == (status, code)
    assert general.requests == []

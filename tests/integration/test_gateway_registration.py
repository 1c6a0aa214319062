"""Registration as slime, Miles and verl call it on their router's address, with no key:
where a registered worker serves, each framework's shapes, and removal from every pool."""

from __future__ import annotations

from typing import Any

import pytest
from fakes.bodies import MASK_GEN

pytestmark = pytest.mark.integration


async def get(gw, path: str) -> tuple[int, Any]:
    async with gw.client.get(gw.url + path) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_with_general_endpoints_configured_registered_workers_serve_masks_only(
    workers, upstreams, gateway, make_config
):
    general = await upstreams(name="general")
    a = await workers(name="a")
    async with gateway(make_config([general.url], [], admin_key="adm")) as gw:
        async with gw.client.post(gw.url + "/add_worker", params={"url": a.url}) as resp:
            assert resp.status == 200
        assert [ep.url for ep in gw.state.pools["mask"].endpoints] == [a.url]
        assert [ep.url for ep in gw.state.pools["general"].endpoints] == [general.url]
        status, out, _ = await gw.post("/generate", MASK_GEN)
        assert (status, out["worker"]) == (200, "a")
        assert (await gw.post("/generate", {"text": "x"}))[0] == 200
    assert [r.path for r in general.requests] == ["/generate"]
    assert a.bodies("/generate") and len(a.bodies("/generate")) == 1


async def test_miles_style_registration_and_removal(workers, gateway, make_config):
    a, b = await workers(name="a"), await workers(name="b")
    async with gateway(make_config([], [], api_keys=["k"])) as gw:
        # Miles posts the URL as a query, its own router also as a JSON body.
        async with gw.client.post(f"{gw.url}/add_worker?url={a.url}") as resp:
            assert resp.status == 200
        async with gw.client.post(gw.url + "/add_worker", json={"url": b.url}) as resp:
            assert resp.status == 200
        status, listed = await get(gw, "/list_workers")
        assert (status, sorted(listed["urls"])) == (200, sorted([a.url, b.url]))
        status, listed = await get(gw, "/workers")
        assert sorted(w["url"] for w in listed["workers"]) == sorted([a.url, b.url])
        assert listed["total"] == 2  # each URL once, though it serves two pools
        # Miles removes by URL in the path.
        async with gw.client.delete(f"{gw.url}/workers/{a.url}") as resp:
            assert resp.status == 202, await resp.text()
        for pool in ("mask", "general"):
            assert [ep.url for ep in gw.state.pools[pool].endpoints] == [b.url]
        # verl removes with ?url=.
        async with gw.client.post(gw.url + "/remove_worker", params={"url": b.url}) as resp:
            assert resp.status == 200
        assert not gw.state.pools["mask"].endpoints and not gw.state.pools["general"].endpoints


async def test_a_worker_url_that_is_not_one_is_refused(gateway, make_config):
    async with gateway(make_config([], [])) as gw:
        for url in (
            "http://a/b",
            "ftp://a",
            "http://u:p@127.0.0.1:1",
            "",
            "http://169.254.169.254",
        ):
            async with gw.client.post(gw.url + "/add_worker", params={"url": url}) as resp:
                assert resp.status == 400, url
        async with gw.client.post(gw.url + "/add_worker", data=b"[1]") as resp:
            assert resp.status == 400
        assert not gw.state.pools["mask"].endpoints

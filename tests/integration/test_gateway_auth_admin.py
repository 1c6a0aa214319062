"""Client API keys, the mask allow-list (rule 2), upstream credentials and the admin API."""

from __future__ import annotations

import pytest
from fakes.bodies import MASK_GEN

pytestmark = pytest.mark.integration


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_api_keys_and_mask_allow_list(upstreams, gateway, make_config):
    general = await upstreams()
    mask = await upstreams()
    config = make_config(
        [general.url],
        [mask.url],
        api_keys=["k-train", "k-app"],
        mask_allow_keys=["k-train"],
        upstream_api_key="up-secret",
    )
    async with gateway(config) as gw:
        status, body, resp = await gw.post("/v1/completions", {"prompt": "x"})
        assert (status, body["error"]["code"]) == (401, "missing_api_key")
        assert resp.headers["WWW-Authenticate"] == "Bearer"
        status, body, _ = await gw.post("/v1/completions", {"prompt": "x"}, headers=bearer("nope"))
        assert (status, body["error"]["code"]) == (401, "invalid_api_key")
        # Rule 2: an authenticated key outside the allow-list may not ask for masks...
        status, body, _ = await gw.post("/generate", MASK_GEN, headers=bearer("k-app"))
        assert (status, body["error"]["code"]) == (403, "sampling_mask_forbidden")
        # ... and rule 1 still comes first.
        status, body, _ = await gw.post("/generate", b"{", headers=bearer("k-app"))
        assert body["error"]["code"] == "invalid_json"
        # ... but may send general traffic, and the allowed key may ask for masks.
        status, _, _ = await gw.post("/v1/completions", {"prompt": "x"}, headers=bearer("k-app"))
        assert status == 200
        status, _, _ = await gw.post("/generate", MASK_GEN, headers=bearer("k-train"))
        assert status == 200
        # Probes need no key.
        async with gw.client.get(gw.url + "/healthz") as resp:
            assert resp.status == 200
    # The client's key stays at the gateway; upstreams get the upstream credential.
    assert general.requests[0].headers["Authorization"] == "Bearer up-secret"
    assert mask.requests[0].headers["Authorization"] == "Bearer up-secret"
    assert len(general.requests) == 1 and len(mask.requests) == 1


async def test_client_authorization_passes_through_without_gateway_keys(
    upstreams, gateway, make_config
):
    general = await upstreams()
    async with gateway(make_config([general.url])) as gw:
        await gw.post("/v1/completions", {"prompt": "x"}, headers=bearer("sk-upstream"))
    assert general.requests[0].headers["Authorization"] == "Bearer sk-upstream"


async def test_admin_api_lists_adds_and_removes_endpoints(upstreams, gateway, make_config):
    general = await upstreams(name="general")
    rollout = await upstreams(name="rollout")
    async with gateway(make_config([general.url], [], admin_key="adm", api_keys=["k"])) as gw:
        url = gw.url + "/admin/pools"
        async with gw.client.get(url, headers=bearer("k")) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == "invalid_admin_key"
        status, body, _ = await gw.post("/generate", MASK_GEN, headers=bearer("k"))
        assert body["error"]["code"] == "mask_pool_unavailable"

        # Register a rollout server in the mask pool, as an RL framework would.
        endpoints = gw.url + "/admin/pools/mask/endpoints"
        async with gw.client.post(
            endpoints, json={"url": rollout.url + "/"}, headers=bearer("adm")
        ) as resp:
            assert resp.status == 201
            assert (await resp.json())["added"] == [rollout.url]
        async with gw.client.post(
            endpoints, json={"url": rollout.url}, headers=bearer("adm")
        ) as resp:
            assert resp.status == 200  # already there: nothing added
        status, _, _ = await gw.post("/generate", MASK_GEN, headers=bearer("k"))
        assert status == 200
        assert len(rollout.requests) == 1

        async with gw.client.get(url, headers={"X-Admin-Key": "adm"}) as resp:
            pools = {p["name"]: p for p in (await resp.json())["pools"]}
        [ep] = pools["mask"]["endpoints"]
        assert ep["url"] == rollout.url and ep["source"] == "admin"
        assert ep["circuit"] == "closed" and ep["outstanding"] == 0
        assert pools["general"]["endpoints"][0]["source"] == "static"

        async with gw.client.post(
            endpoints, json={"url": "ftp://x"}, headers=bearer("adm")
        ) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "invalid_endpoint"
        async with gw.client.post(
            gw.url + "/admin/pools/nope/endpoints", json={"url": rollout.url}, headers=bearer("adm")
        ) as resp:
            assert resp.status == 404
        async with gw.client.delete(
            endpoints, params={"url": rollout.url}, headers=bearer("adm")
        ) as resp:
            assert resp.status == 200
            assert (await resp.json())["removed"] == [rollout.url]
        async with gw.client.delete(
            endpoints, params={"url": rollout.url}, headers=bearer("adm")
        ) as resp:
            assert resp.status == 404
        status, body, _ = await gw.post("/generate", MASK_GEN, headers=bearer("k"))
        assert body["error"]["code"] == "mask_pool_unavailable"
    assert len(rollout.requests) == 1 and general.requests == []

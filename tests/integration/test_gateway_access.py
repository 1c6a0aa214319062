"""Who reaches which route: the caller's address for the control plane (trusted_networks,
behind trusted_proxies), insecure_control, SGLang's admin and debug routes (404, whatever the
key), the routes beside the OpenAI ones, and the keys the gateway sends upstream."""

from __future__ import annotations

import logging

import pytest
from fakes.bodies import MASK_CHAT

from maskgate.gateway import create_app
from maskgate.gateway.routes import main_table

pytestmark = pytest.mark.integration

NEVER = [
    "/get_weights_by_name",
    "/load_lora_adapter",
    "/start_profile",
    "/set_internal_state",
    "/configure_logging",
    "/dump_expert_distribution_record",
    "/update_weights_from_ipc",
    "/get_server_info",
    "/vertex_generate",
    "/v1/responses",
    "/encode",
    "/v1/rerank",
]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    ("forwarded_for", "status"),
    [
        ("10.1.2.3", 200),  # the proxy saw a trusted caller
        ("10.1.2.3, 8.8.8.8", 403),  # the proxy saw 8.8.8.8; 10.1.2.3 is the client's claim
        ("8.8.8.8, 127.0.0.2", 403),  # right-most untrusted hop: 8.8.8.8
        (None, 403),  # the proxy itself (127.0.0.1) is not in trusted_networks
    ],
)
async def test_behind_a_trusted_proxy_the_hop_it_saw_decides(
    upstreams, gateway, make_config, forwarded_for, status
):
    mask = await upstreams()
    config = make_config(
        [], [mask.url], trusted_networks=["10.0.0.0/8"], trusted_proxies=["127.0.0.0/8"]
    )
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    async with gateway(config) as gw:
        got, body, _ = await gw.post("/flush_cache", {}, headers=headers)
        assert got == status, body
    assert len([r for r in mask.requests if r.path == "/flush_cache"]) == (status == 200)


async def test_forwarded_for_counts_only_from_a_trusted_proxy(upstreams, gateway, make_config):
    mask = await upstreams()
    config = make_config([], [mask.url], trusted_networks=["10.0.0.0/8"])
    async with gateway(config) as gw:
        status, body, _ = await gw.post("/flush_cache", {}, headers={"X-Forwarded-For": "10.0.0.1"})
        assert (status, body["error"]["code"]) == (403, "control_forbidden")
        assert "trusted_networks" in body["error"]["message"]


async def test_insecure_control_opens_control_to_anyone_and_says_so(
    upstreams, gateway, make_config, caplog
):
    mask = await upstreams()
    config = make_config([], [mask.url], trusted_networks=[], insecure_control=True)
    with caplog.at_level(logging.WARNING, logger="maskgate"):
        async with gateway(config) as gw:
            assert (await gw.post("/flush_cache", {}))[0] == 200
    assert any("INSECURE" in r.getMessage() for r in caplog.records)


async def test_control_off_is_logged_and_every_control_path_is_404(make_config, caplog):
    config = make_config([], [], host="0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="maskgate"):
        create_app(config)
    assert any("control plane" in r.getMessage() for r in caplog.records)
    assert "/pause_generation" not in {row.path for row in main_table(config)}


@pytest.mark.parametrize("path", NEVER)
@pytest.mark.parametrize("key", ["k", "adm", None])
async def test_sglang_admin_and_debug_routes_are_never_reached(
    upstreams, gateway, make_config, path, key
):
    general = await upstreams()
    mask = await upstreams()
    config = make_config([general.url], [mask.url], api_keys=["k"], admin_key="adm")
    async with gateway(config) as gw:
        for method in ("GET", "POST"):
            headers = bearer(key) if key else {}
            async with gw.client.request(method, gw.url + path, json={}, headers=headers) as resp:
                assert resp.status == 404
                assert (await resp.json())["error"]["code"] == "not_found"
    assert general.requests == [] and mask.requests == []


async def test_invocations_is_chat_under_the_policy(upstreams, gateway, make_config):
    general = await upstreams()
    mask = await upstreams()
    async with gateway(make_config([general.url], [mask.url])) as gw:
        status, body, _ = await gw.post("/invocations", {**MASK_CHAT, "top_k": -1})
        assert (status, body["error"]["code"]) == (400, "sampling_mask_full_vocabulary")
        assert (await gw.post("/invocations", MASK_CHAT))[0] == 200
        assert (await gw.post("/invocations", {"messages": []}))[0] == 200
    assert [r.path for r in mask.requests] == ["/v1/chat/completions"]
    assert [r.path for r in general.requests] == ["/v1/chat/completions"]


async def test_tokenize_and_ping_are_served(upstreams, gateway, make_config):
    general = await upstreams()
    async with gateway(make_config([general.url], [])) as gw:
        for path in ("/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize"):
            assert (await gw.post(path, {"prompt": "x"}))[0] == 200
        async with gw.client.get(gw.url + "/ping") as resp:
            assert resp.status == 200
    assert [r.path for r in general.requests] == [
        "/tokenize",
        "/detokenize",
        "/v1/tokenize",
        "/v1/detokenize",
    ]


async def test_control_calls_carry_the_admin_key_and_traffic_the_api_key(
    upstreams, gateway, make_config
):
    general = await upstreams()
    mask = await upstreams()
    config = make_config(
        [general.url], [mask.url], upstream_api_key="up", upstream_admin_api_key="up-admin"
    )
    async with gateway(config) as gw:
        assert (await gw.post("/v1/completions", {"prompt": "x"}, headers=bearer("c")))[0] == 200
        assert (await gw.post("/pause_generation", {}))[0] == 200
        assert (await gw.post("/continue_generation", {}))[0] == 200
        async with gw.client.get(gw.url + "/v1/loads") as resp:
            assert resp.status == 200
    sent = {(r.method, r.path): r.headers.get("Authorization") for r in general.received}
    sent |= {(r.method, r.path): r.headers.get("Authorization") for r in mask.received}
    assert sent[("POST", "/v1/completions")] == "Bearer up"  # the client's key replaced
    assert sent[("POST", "/pause_generation")] == "Bearer up-admin"
    assert sent[("POST", "/continue_generation")] == "Bearer up-admin"
    assert sent[("GET", "/v1/loads")] == "Bearer up"


async def test_without_an_admin_upstream_key_control_calls_carry_the_api_key(
    upstreams, gateway, make_config
):
    mask = await upstreams()
    async with gateway(make_config([], [mask.url], upstream_api_key="up")) as gw:
        assert (await gw.post("/abort_request", {"abort_all": True}))[0] == 200
    assert [r.headers["Authorization"] for r in mask.requests] == ["Bearer up"]

"""Errors out of any handler are answered by the one renderer, though the main app has no
middleware: every row of the route table is wrapped instead, and the 404 of an undeclared
path and the 405 of an undeclared method are routes of their own, in JSON too."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from maskgate.gateway import GatewayConfig, create_app
from maskgate.gateway.app import create_admin_app, create_probe_app
from maskgate.gateway.proxy import handler as proxy_module
from maskgate.protocol.settings import load_settings


def config():
    pools = {"general": {"endpoints": [], "health_path": None}, "mask": {"endpoints": []}}
    overrides = {"host": "127.0.0.1", "access_log": False, "pools": pools}
    return load_settings(GatewayConfig, overrides=overrides)


async def test_a_bug_in_a_handler_is_a_json_500(monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(proxy_module, "_proxy", broken)
    app = create_app(config())
    assert not app.middlewares
    async with TestClient(TestServer(app)) as client:
        for method, path in (("POST", "/v1/chat/completions"), ("PUT", "/generate")):
            resp = await client.request(method, path, json={})
            assert resp.status == 500
            assert (await resp.json())["error"]["code"] == "internal_error"
        for method, path, status, code in (
            ("PUT", "/any/other/path", 404, "not_found"),
            ("GET", "/generate", 405, "method_not_allowed"),
        ):
            resp = await client.request(method, path, json={})
            assert resp.status == status
            assert (await resp.json())["error"]["code"] == code


async def test_api_errors_keep_their_status_code_and_headers():
    async with TestClient(TestServer(create_app(config()))) as client:
        resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert resp.status == 503 and resp.headers["Retry-After"] == "5"
        assert (await resp.json())["error"]["code"] == "no_healthy_upstream"
        resp = await client.post("/generate", data=b"{not json")
        assert resp.status == 400 and "X-Request-Id" in resp.headers


async def test_the_probe_app_answers_unknown_paths_in_json():
    app = create_app(config())
    async with TestClient(TestServer(create_probe_app(app))) as client:
        resp = await client.get("/nope")
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
        resp = await client.post("/healthz")
        assert resp.status == 405
        assert (await resp.json())["error"]["code"] == "method_not_allowed"


async def test_control_registration_and_admin_routes_answer_in_json():
    """The routes beside the inference ones (control, registration, the admin refusal, the
    admin listener's app) are wrapped too."""
    app = create_app(config())
    async with TestClient(TestServer(app)) as client:
        for method, path, status, code in (
            ("GET", "/admin/pools", 404, "admin_api_disabled"),
            ("POST", "/workers", 400, "invalid_endpoint"),  # a control row (trusted network)
            ("POST", "/pause_generation", 503, "no_trained_endpoints"),
        ):
            resp = await client.request(method, path, json={})
            assert resp.status == status, (path, await resp.text())
            assert (await resp.json())["error"]["code"] == code
    async with TestClient(TestServer(create_admin_app(create_app(config())))) as client:
        resp = await client.post("/admin/pools/nope/endpoints", json={"endpoints": ["http://a"]})
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "unknown_pool"
        resp = await client.get("/nope")
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"

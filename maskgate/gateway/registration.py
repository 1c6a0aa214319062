"""Worker registration as RL frameworks do it with sgl-model-gateway, mapped onto the pools.

- `POST /workers {"url", "worker_type"}`, `GET /workers`, `GET|DELETE /workers/{id}`: the
  current sgl-model-gateway shapes. A worker lands in the trained pool (`control.trained_pool`,
  the mask pool by default); `GET /workers` lists every pool's endpoints.
- `POST /add_worker?url=`, `POST /remove_worker?url=`, `GET /list_workers`: the older router's.
- `GET /v1/loads` (and `/get_loads`): each endpoint's own `/v1/loads`, summed per worker.

A worker id is a UUID derived from its URL (uuid5), so it is the same in every gateway process
and after a restart; `DELETE /workers/{id}` also takes the URL itself (older routers did).
Registration takes effect at once; 202 is kept because clients of sgl-model-gateway expect it.
Every path here but `/v1/loads` needs the admin key (or, without one, a client key).
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import web

from maskgate.gateway.admin import admin_disabled
from maskgate.gateway.admin_urls import check_endpoint_url
from maskgate.gateway.auth import authenticate, check_admin
from maskgate.gateway.bodyread import read_body
from maskgate.gateway.config import normalize_endpoint
from maskgate.gateway.fanout import fan_out
from maskgate.gateway.health import check_endpoint
from maskgate.gateway.pool import Endpoint, Pool
from maskgate.gateway.state import STATE, GatewayState
from maskgate.gateway.versions import at_least
from maskgate.protocol.errors import ApiError
from maskgate.protocol.responses import json_response

_LOADS_TIMEOUT_S = 5.0


def worker_id(url: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, url))


def _admin(request: web.Request) -> GatewayState:
    state = request.app[STATE]
    check_admin(request.headers, state.config.admin_key)
    return state


def _url(value: object) -> str:
    if not isinstance(value, str):
        raise ApiError(
            "invalid_endpoint", "url must be a string like http://host:port", param="url"
        )
    try:
        return normalize_endpoint(value)
    except ValueError as e:
        raise ApiError("invalid_endpoint", str(e), param="url") from e


def _info(pool: Pool, ep: Endpoint) -> dict[str, Any]:
    return {
        "id": worker_id(ep.url),
        "url": ep.url,
        "model_id": None,
        "priority": 50,
        "cost": 1.0,
        "worker_type": "regular",
        "is_healthy": ep.usable(),
        "load": ep.outstanding,
        "connection_mode": "http",
        "metadata": {"pool": pool.name, **ep.describe()},
    }


async def _register(state: GatewayState, url: str) -> Pool:
    """Add to the trained pool, as the admin API adds: unsafe URLs refused, and no traffic
    until a health check passes (the first one runs now). Registering again an endpoint that
    a sync ejected without a version lets it back in (after the pool's version, if any)."""
    await check_endpoint_url(state, url)
    pool = state.pools[state.config.control.trained_pool]
    ep = pool.add(url, "admin", gated=True)
    if ep is None:
        ep = next(ep for ep in pool.endpoints if ep.url == url)
        behind = pool.version is not None and not at_least(ep.weight_version, pool.version)
        ep.stale, ep.rejoin = behind, True
    elif pool.cfg.health_path is not None:
        await check_endpoint(state, pool, ep)
    return pool


def _find(state: GatewayState, key: str) -> list[tuple[Pool, Endpoint]]:
    """Endpoints whose id, or URL (older clients), is `key`."""
    key = unquote(key)
    return [
        (pool, ep)
        for pool in state.pools.values()
        for ep in pool.endpoints
        if key in (worker_id(ep.url), ep.url)
    ]


async def add_worker(request: web.Request) -> web.Response:
    state = _admin(request)
    try:
        body = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError as e:
        raise ApiError("invalid_json", f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ApiError("invalid_request", 'send {"url": "http://host:port"}', param="url")
    url = _url(body.get("url"))
    kind = body.get("worker_type", "regular")
    if kind not in (None, "regular"):
        raise ApiError(
            "unsupported_worker_type",
            f"worker_type {kind!r} is not served here: prefill/decode disaggregation is not "
            "supported, register workers as 'regular'",
            param="worker_type",
        )
    pool = await _register(state, url)
    wid = worker_id(url)
    body = {
        "status": "accepted",
        "worker_id": wid,
        "url": url,
        "pool": pool.name,
        "location": f"/workers/{wid}",
        "message": f"Worker added to the {pool.name} pool",
    }
    return json_response(body, status=202, headers={"Location": f"/workers/{wid}"})


async def list_workers(request: web.Request) -> web.Response:
    state = _admin(request)
    workers = [_info(pool, ep) for pool in state.pools.values() for ep in pool.endpoints]
    stats = {"prefill_count": 0, "decode_count": 0, "regular_count": len(workers)}
    return json_response({"workers": workers, "total": len(workers), "stats": stats})


def _one(state: GatewayState, key: str) -> list[tuple[Pool, Endpoint]]:
    found = _find(state, key)
    if not found:
        raise ApiError("worker_not_found", f"Worker {key} not found", status=404)
    return found


async def get_worker(request: web.Request) -> web.Response:
    state = _admin(request)
    pool, ep = _one(state, request.match_info["worker_id"])[0]
    return json_response(_info(pool, ep))


async def delete_worker(request: web.Request) -> web.Response:
    state = _admin(request)
    key = request.match_info["worker_id"]
    found = _one(state, key)
    for pool, ep in found:
        pool.remove(ep.url)
    body = {"status": "accepted", "worker_id": worker_id(found[0][1].url), "message": "removed"}
    return json_response(body, status=202)


async def legacy_add(request: web.Request) -> web.Response:
    state = _admin(request)
    url = _url(request.query.get("url"))
    pool = await _register(state, url)
    return json_response(
        {"status": "ok", "message": f"Successfully added worker: {url}", "pool": pool.name}
    )


async def legacy_remove(request: web.Request) -> web.Response:
    state = _admin(request)
    url = _url(request.query.get("url"))
    found = _one(state, url)
    for pool, ep in found:
        pool.remove(ep.url)
    return json_response({"status": "ok", "message": f"Successfully removed worker: {url}"})


async def legacy_list(request: web.Request) -> web.Response:
    state = _admin(request)
    return json_response(
        {"urls": [ep.url for pool in state.pools.values() for ep in pool.endpoints]}
    )


def _load(data: Any) -> tuple[int, int]:
    """(running, waiting) from an engine's `/v1/loads` answer; (-1, -1) when unreadable."""
    loads = data.get("loads") if isinstance(data, dict) else None
    if not isinstance(loads, list):
        return -1, -1
    running = waiting = 0
    for item in loads:
        if not isinstance(item, dict):
            return -1, -1
        r, w = item.get("num_running_reqs", 0), item.get("num_waiting_reqs", 0)
        if not (isinstance(r, int) and isinstance(w, int)):
            return -1, -1
        running, waiting = running + r, waiting + w
    return running, waiting


async def loads(request: web.Request) -> web.Response:
    state = request.app[STATE]
    authenticate(request.headers, state.api_keys)
    members = [(pool, ep) for pool in state.pools.values() for ep in pool.endpoints]
    include = request.query.get("include", "core")
    path = f"/v1/loads?include={include}"
    replies = await fan_out(
        state, [ep.url for _, ep in members], "GET", path, None, _LOADS_TIMEOUT_S
    )
    out: list[dict[str, Any]] = []
    for (pool, ep), reply in zip(members, replies, strict=True):
        running, waiting = _load(reply.json()) if reply.status == 200 else (-1, -1)
        load = -1 if running < 0 else running + waiting
        out.append(
            {
                "worker": ep.url,
                "worker_type": "regular",
                "pool": pool.name,
                "load": load,
                "num_running_reqs": running,
                "num_waiting_reqs": waiting,
            }
        )
    ok = [w for w in out if w["load"] >= 0]
    return json_response(
        {
            "loads": out,
            "total_workers": len(out),
            "successful": len(ok),
            "failed": len(out) - len(ok),
            "num_running_reqs": sum(w["num_running_reqs"] for w in ok),
            "num_waiting_reqs": sum(w["num_waiting_reqs"] for w in ok),
        }
    )


REGISTRATION_PATHS = (
    "/workers",
    "/workers/{worker_id:.+}",
    "/add_worker",
    "/remove_worker",
    "/list_workers",
)


def add_registration_routes(app: web.Application, *, enabled: bool) -> None:
    """Registration changes the pools, so it is part of the admin API: served where the admin
    API is (admin_key set, or the loopback admin listener). Elsewhere its paths answer 404
    `admin_api_disabled` and never reach an upstream."""
    if not enabled:
        for path in REGISTRATION_PATHS:
            app.router.add_route("*", path, admin_disabled)
        return
    app.router.add_post("/workers", add_worker)
    app.router.add_get("/workers", list_workers, allow_head=False)
    app.router.add_get("/workers/{worker_id:.+}", get_worker, allow_head=False)
    app.router.add_delete("/workers/{worker_id:.+}", delete_worker)
    app.router.add_post("/add_worker", legacy_add)
    app.router.add_post("/remove_worker", legacy_remove)
    app.router.add_get("/list_workers", legacy_list, allow_head=False)


def add_load_routes(app: web.Application) -> None:
    app.router.add_get("/v1/loads", loads, allow_head=False)
    app.router.add_get("/get_loads", loads, allow_head=False)

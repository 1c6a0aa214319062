"""Worker registration as RL frameworks do it with sgl-model-gateway, mapped onto the pools.

- `POST /workers {"url", "worker_type"}`, `GET /workers`, `GET|DELETE /workers/{id}`: the
  current sgl-model-gateway shapes. `GET /workers` lists each worker once, with its pools.
- `POST /add_worker?url=` (or `{"url"}` as a body), `POST /remove_worker?url=`,
  `GET /list_workers`: the older router's (slime, Miles and verl call these).
- `GET /v1/loads` (and `/get_loads`): each endpoint's own `/v1/loads`, summed per worker.

Where a registered worker serves (docs/rl.md): it joins the trained pool
(`control.trained_pool`, the mask pool by default). When the trained pool is the mask pool
and the general pool has no endpoints of its own in the configuration (no `endpoints`, no
`dns`), it joins the general pool too: a framework that registers all its engines then has
both its mask and its other rollout requests served by them.

A worker id is a UUID derived from its URL (uuid5), so it is the same in every gateway process
and after a restart; `DELETE /workers/{id}` also takes the URL itself (older routers did).
Registration takes effect at once; 202 is kept because clients of sgl-model-gateway expect it.
Who may call each path is the route table's (routes.py): registration is a `control` row
(the admin key or a trusted network), `/v1/loads` a `client` row.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import web

from maskgate.gateway.clients.bodyread import read_body
from maskgate.gateway.config import normalize_endpoint
from maskgate.gateway.pools.health import check_endpoint
from maskgate.gateway.pools.pool import Endpoint, Pool
from maskgate.gateway.pools.versions import at_least
from maskgate.gateway.rl.admin_urls import check_endpoint_url
from maskgate.gateway.rl.fanout import fan_out
from maskgate.gateway.rl.weight_sync import poll_version
from maskgate.gateway.state import STATE, GatewayState
from maskgate.gateway.upstream import outbound
from maskgate.protocol.errors import ApiError
from maskgate.protocol.responses import json_response

_LOADS_TIMEOUT_S = 5.0


def worker_id(url: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, url))


def _url(value: object) -> str:
    if not isinstance(value, str):
        raise ApiError(
            "invalid_endpoint", "url must be a string like http://host:port", param="url"
        )
    try:
        return normalize_endpoint(value)
    except ValueError as e:
        raise ApiError("invalid_endpoint", str(e), param="url") from e


def _info(pools: list[Pool], ep: Endpoint) -> dict[str, Any]:
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
        "metadata": {
            "pool": pools[0].name,
            "pools": [pool.name for pool in pools],
            **ep.describe(),
        },
    }


def _workers(state: GatewayState) -> list[tuple[list[Pool], Endpoint]]:
    """Each endpoint URL once, with every pool it is in (trained pool first)."""
    trained = state.config.control.trained_pool
    order = sorted(state.pools.values(), key=lambda pool: pool.name != trained)
    found: dict[str, tuple[list[Pool], Endpoint]] = {}
    for pool in order:
        for ep in pool.endpoints:
            found.setdefault(ep.url, ([], ep))[0].append(pool)
    return list(found.values())


def serving_pools(state: GatewayState) -> list[Pool]:
    """The pools a registered worker joins (the rule in the module docstring)."""
    trained = state.pools[state.config.control.trained_pool]
    general = state.pools["general"]
    own = general.cfg.endpoints or general.cfg.dns is not None
    return [trained] if trained is general or own else [trained, general]


async def _register(state: GatewayState, url: str) -> Pool:
    """Add to the pools `serving_pools` names, as the admin API adds: unsafe URLs refused,
    and no traffic until a health check passes (the first one runs now). Registering again
    an endpoint that a sync ejected without a version lets it back in (after the pool's
    version, if any). Returns the trained pool."""
    await check_endpoint_url(state, url)
    pools = serving_pools(state)
    for pool in pools:
        ep = pool.add(url, "admin", gated=True)
        if ep is None:
            ep = next(ep for ep in pool.endpoints if ep.url == url)
            behind = pool.version is not None and not at_least(ep.weight_version, pool.version)
            ep.stale, ep.rejoin = behind, True
        elif pool.cfg.health_path is not None:
            await check_endpoint(state, pool, ep, poll_version)
    return pools[0]


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
    state = request.app[STATE]
    body = await _body(request)
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


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError as e:
        raise ApiError("invalid_json", f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ApiError("invalid_request", 'send {"url": "http://host:port"}', param="url")
    return body


async def list_workers(request: web.Request) -> web.Response:
    state = request.app[STATE]
    workers = [_info(pools, ep) for pools, ep in _workers(state)]
    stats = {"prefill_count": 0, "decode_count": 0, "regular_count": len(workers)}
    return json_response({"workers": workers, "total": len(workers), "stats": stats})


def _one(state: GatewayState, key: str) -> list[tuple[Pool, Endpoint]]:
    found = _find(state, key)
    if not found:
        raise ApiError("worker_not_found", f"Worker {key} not found", status=404)
    return found


async def get_worker(request: web.Request) -> web.Response:
    state = request.app[STATE]
    url = _one(state, request.match_info["worker_id"])[0][1].url
    pools, ep = next((pools, ep) for pools, ep in _workers(state) if ep.url == url)
    return json_response(_info(pools, ep))


async def delete_worker(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = request.match_info["worker_id"]
    found = _one(state, key)
    for pool, ep in found:
        pool.remove(ep.url)
    body = {"status": "accepted", "worker_id": worker_id(found[0][1].url), "message": "removed"}
    return json_response(body, status=202)


async def legacy_add(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if "url" in request.query or not request.can_read_body:
        url = _url(request.query.get("url"))
    else:
        url = _url((await _body(request)).get("url"))
    pool = await _register(state, url)
    return json_response(
        {"status": "ok", "message": f"Successfully added worker: {url}", "pool": pool.name}
    )


async def legacy_remove(request: web.Request) -> web.Response:
    state = request.app[STATE]
    url = _url(request.query.get("url"))
    found = _one(state, url)
    for pool, ep in found:
        pool.remove(ep.url)
    return json_response({"status": "ok", "message": f"Successfully removed worker: {url}"})


async def legacy_list(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return json_response({"urls": [ep.url for _, ep in _workers(state)]})


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
    members = [(pools[0], ep) for pools, ep in _workers(state)]
    path = outbound.target("/v1/loads", [("include", request.query.get("include", "core"))])
    urls = [ep.url for _, ep in members]
    replies = await fan_out(state, urls, "GET", path, None, _LOADS_TIMEOUT_S)
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

"""The admin API: inspect pools and add or remove endpoints at run time.

RL frameworks register their rollout servers here. Changes live in memory (a restart returns
to the configuration); with `workers > 1` the control leader makes them and every process
copies them (leader.py).

Secure by default: the API's rows (routes.py, `admin` access) exist only when `admin_key` is
set (on the traffic port, key required) or `admin_port` opens a loopback-only listener
(app.py, serve.py); otherwise `/admin/...` answers 404 `admin_api_disabled`. URLs are checked by
admin_urls.py. An endpoint added here takes no traffic until a health check has passed: the
first one runs before the answer, and the answer shows its result (`healthy`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from maskgate.gateway.clients.bodyread import read_body
from maskgate.gateway.config import normalize_endpoint
from maskgate.gateway.pools.health import check_endpoint
from maskgate.gateway.pools.pool import Pool
from maskgate.gateway.rl.admin_urls import check_endpoint_url
from maskgate.gateway.rl.weight_sync import poll_version
from maskgate.gateway.state import STATE, GatewayState
from maskgate.protocol.errors import ApiError
from maskgate.protocol.responses import json_response


def _pool(state: GatewayState, request: web.Request) -> Pool:
    name = request.match_info["pool"]
    pool = state.pools.get(name)
    if pool is None:
        raise ApiError(
            "unknown_pool",
            f"no pool named {name!r}; pools: {', '.join(state.pools)}",
            status=404,
            param="pool",
        )
    return pool


async def _urls(request: web.Request) -> list[str]:
    """Endpoint URLs from `{"url": ...}`, `{"urls": [...]}` or `?url=...` (repeatable)."""
    urls: list[Any] = list(request.query.getall("url", []))
    if request.can_read_body:
        try:
            body = orjson.loads(await read_body(request))
        except orjson.JSONDecodeError as e:
            raise ApiError("invalid_json", f"request body is not valid JSON: {e}") from e
        if not isinstance(body, dict) or not ({"url", "urls"} & body.keys()):
            raise ApiError(
                "invalid_endpoint",
                'send {"url": "http://host:port"} or {"urls": [...]}',
                param="url",
            )
        if "url" in body:
            urls.append(body["url"])
        extra = body.get("urls", [])
        if not isinstance(extra, list):
            raise ApiError("invalid_endpoint", "urls must be a list", param="urls")
        urls.extend(extra)
    if not urls:
        raise ApiError("invalid_endpoint", "no endpoint URL given", param="url")
    out = []
    for url in urls:
        if not isinstance(url, str):
            raise ApiError("invalid_endpoint", "an endpoint URL must be a string", param="url")
        try:
            out.append(normalize_endpoint(url))
        except ValueError as e:
            raise ApiError("invalid_endpoint", str(e), param="url") from e
    return out


async def list_pools(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return json_response({"pools": [pool.describe() for pool in state.pools.values()]})


async def add_endpoints(request: web.Request) -> web.Response:
    state = request.app[STATE]
    pool = _pool(state, request)
    urls = await _urls(request)
    for url in urls:
        await check_endpoint_url(state, url)
    new = [ep for url in urls if (ep := pool.add(url, "admin", gated=True)) is not None]
    if pool.cfg.health_path is not None and new:
        await asyncio.gather(*(check_endpoint(state, pool, ep, poll_version) for ep in new))
    added = [ep.url for ep in new]
    return json_response({"added": added, "pool": pool.describe()}, status=201 if added else 200)


async def remove_endpoints(request: web.Request) -> web.Response:
    state = request.app[STATE]
    pool = _pool(state, request)
    urls = await _urls(request)
    missing = [url for url in urls if all(ep.url != url for ep in pool.endpoints)]
    if missing:
        raise ApiError(
            "unknown_endpoint",
            f"not in pool {pool.name!r}: {', '.join(missing)}",
            status=404,
            param="url",
        )
    for url in urls:
        pool.remove(url)
    return json_response({"removed": urls, "pool": pool.describe()})


async def admin_disabled(request: web.Request) -> web.Response:
    raise ApiError(
        "admin_api_disabled",
        "the admin API is off: set admin_key (then send it as 'Authorization: Bearer KEY'), "
        "or admin_port for a loopback-only admin listener",
        status=404,
    )

"""The admin API: inspect pools and add or remove endpoints at run time.

RL frameworks register their rollout servers here. Changes live in this process's memory
(a restart returns to the configuration; with `workers > 1` each process has its own pools).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from maskgate.gateway.auth import check_admin
from maskgate.gateway.config import normalize_endpoint
from maskgate.gateway.pool import Pool
from maskgate.gateway.state import STATE, GatewayState
from maskgate.protocol.errors import ApiError


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _authorized(request: web.Request) -> GatewayState:
    state = request.app[STATE]
    check_admin(request.headers, state.config.admin_key, state.api_keys)
    return state


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
            body = orjson.loads(await request.read())
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
    state = _authorized(request)
    return _json({"pools": [pool.describe() for pool in state.pools.values()]})


async def add_endpoints(request: web.Request) -> web.Response:
    state = _authorized(request)
    pool = _pool(state, request)
    added = [url for url in await _urls(request) if pool.add(url, "admin") is not None]
    return _json({"added": added, "pool": pool.describe()}, status=201 if added else 200)


async def remove_endpoints(request: web.Request) -> web.Response:
    state = _authorized(request)
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
    return _json({"removed": urls, "pool": pool.describe()})


def add_admin_routes(app: web.Application) -> None:
    app.router.add_get("/admin/pools", list_pools)
    app.router.add_post("/admin/pools/{pool}/endpoints", add_endpoints)
    app.router.add_delete("/admin/pools/{pool}/endpoints", remove_endpoints)

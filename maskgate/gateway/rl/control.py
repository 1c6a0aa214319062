"""SGLang's RL control paths on the gateway: each acts on the whole trained pool, never on one
worker (docs/rl.md). Same paths and bodies as an SGLang engine, so a trainer written for one
engine drives a pool of them through one URL.

Who may call each path is the route table's (routes.py, access.py): the paths that change
state are `control` rows (the admin key or a trusted network), the read-only ones
(`/model_info`, `/get_weight_version`, `/get_world_size`) `client` rows.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from maskgate.gateway.clients.bodyread import read_body
from maskgate.gateway.pools.pool import Endpoint, Pool
from maskgate.gateway.pools.versions import MIXED, pool_version, strict_version
from maskgate.gateway.rl.fanout import answer, call, fan_out
from maskgate.gateway.rl.holds import PoolControl
from maskgate.gateway.rl.weight_sync import run_update, set_version
from maskgate.gateway.state import STATE, GatewayState
from maskgate.gateway.upstream import outbound
from maskgate.protocol.errors import ApiError, ServerError
from maskgate.protocol.responses import json_response

CONTROL = web.AppKey("maskgate_control", PoolControl)
LOG = logging.getLogger("maskgate.control")
_INFO_TIMEOUT_S = 5.0  # one endpoint's /model_info

UPDATE_PATHS = {
    "/update_weights_from_disk": ("disk", ("model_path",)),
    "/update_weights_from_distributed": ("distributed", ("names", "dtypes", "shapes")),
    "/update_weights_from_tensor": ("tensor", ("serialized_named_tensors",)),
}


def _admin(request: web.Request) -> tuple[GatewayState, PoolControl]:
    return request.app[STATE], request.app[CONTROL]


async def _object(request: web.Request, required: tuple[str, ...] = ()) -> tuple[bytes, dict]:
    """The body as (bytes, dict); `{}` when empty. 400 on anything but a JSON object, or on a
    `weight_version` that is not a version string (SGLang's is `Optional[str]`: an integer
    is refused before anything reaches an endpoint)."""
    raw = await read_body(request)
    if not raw.strip():
        raw = b"{}"
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError("invalid_json", f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ApiError("invalid_request", "the request body must be a JSON object")
    for name in required:
        if name not in body:
            raise ApiError("missing_field", f"{name!r} is required", param=name)
    if body.get("weight_version") is not None:
        _version_field(body, "weight_version")
    return raw, body


def _version_field(body: dict[str, Any], name: str) -> str:
    version = strict_version(body.get(name))
    if version is None:
        raise ApiError(
            "invalid_weight_version",
            f"{name} must be a non-empty printable string (send str(step), not a number)",
            param=name,
        )
    return version


def _members(pool: Pool) -> list[Endpoint]:
    """The endpoints a control call reaches: every one not known to be down."""
    members = [ep for ep in pool.endpoints if ep.healthy is not False]
    if not members:
        raise _no_trained(f"the trained pool ({pool.name}) has no healthy endpoint")
    return members


def _no_trained(problem: str) -> ServerError:
    """503 with a retry hint: no endpoint of the trained pool can take the call now."""
    return ServerError("no_trained_endpoints", problem, status=503, headers={"Retry-After": "5"})


async def _broadcast(
    state: GatewayState, pool: Pool, method: str, path: str, raw: bytes | None
) -> list[dict[str, Any]]:
    urls = [ep.url for ep in _members(pool)]
    replies = await fan_out(state, urls, method, path, raw, state.config.control.timeout_s)
    return [r.result() for r in replies]


async def _hold_and_broadcast(
    state: GatewayState, ctl: PoolControl, reason: str, path: str, raw: bytes
) -> list[dict[str, Any]]:
    """Holds new requests for `reason` (lifted by the matching resume call), shares the hold
    with the other processes, then POSTs `path` to the trained pool. With no endpoint to
    reach, or when every endpoint refused, no hold is left behind."""
    async with ctl.lock:
        urls = [ep.url for ep in _members(ctl.pool)]
        ctl.hold(reason)
        held = False
        try:
            await ctl.shared()
            replies = await fan_out(state, urls, "POST", path, raw, state.config.control.timeout_s)
            held = any(r.ok for r in replies)
        finally:
            if not held:
                ctl.unhold(reason)
                await ctl.shared()
        return [r.result() for r in replies]


async def update_weights(request: web.Request) -> web.Response:
    state, ctl = _admin(request)
    kind, required = UPDATE_PATHS[request.path]
    raw, _ = await _object(request, required)
    _members(ctl.pool)
    results = await run_update(state, ctl, kind, request.path, raw)
    return answer(
        f"weight update ({kind})", "weight_sync_failed", results, {"num_paused_requests": 0}
    )


async def pause_generation(request: web.Request) -> web.Response:
    state, ctl = _admin(request)
    raw, body = await _object(request)
    if body.get("mode", "abort") not in ("abort", "retract", "in_place"):
        raise ApiError("invalid_mode", "mode must be abort, retract or in_place", param="mode")
    # new requests wait at the gateway until /continue_generation
    results = await _hold_and_broadcast(state, ctl, "paused", "/pause_generation", raw)
    ok = {"message": "Generation paused successfully.", "status": "ok"}
    return answer("pause_generation", "control_failed", results, ok)


async def continue_generation(request: web.Request) -> web.Response:
    state, ctl = _admin(request)
    raw, _ = await _object(request)
    async with ctl.lock:
        await ctl.shared()  # versions and stale endpoints of updates made while paused
        try:
            results = await _broadcast(state, ctl.pool, "POST", "/continue_generation", raw)
        finally:
            if "released" in ctl.unhold_all():
                LOG.warning("/continue_generation lifted the hold of a memory release")
    ok = {"message": "Generation continued successfully.", "status": "ok"}
    return answer("continue_generation", "control_failed", results, ok)


async def release_memory(request: web.Request) -> web.Response:
    state, ctl = _admin(request)
    raw, _ = await _object(request)
    # a released worker must get no request until resumed
    results = await _hold_and_broadcast(state, ctl, "released", request.path, raw)
    return answer("release_memory_occupation", "control_failed", results)


async def resume_memory(request: web.Request) -> web.Response:
    state, ctl = _admin(request)
    raw, _ = await _object(request)
    async with ctl.lock:
        try:
            results = await _broadcast(state, ctl.pool, "POST", request.path, raw)
        finally:
            ctl.unhold("released")
    return answer("resume_memory_occupation", "control_failed", results)


async def flush_cache(request: web.Request) -> web.Response:
    """Once on every endpoint, no retry: 400 while any is busy, like one engine, so the
    trainer's own retry loop works unchanged."""
    state, ctl = _admin(request)
    target = outbound.target("/flush_cache", request.query.items())
    results = await _broadcast(state, ctl.pool, "POST", target, None)
    return answer("flush_cache", "flush_cache_failed", results, {"message": "Cache flushed."})


async def to_every_endpoint(request: web.Request) -> web.Response:
    """The call, as sent, to every endpoint: `/abort_request` (an unknown rid is a no-op
    there, and abort_all reaches all), and Miles' `/begin_weight_update` /
    `/end_weight_update` around a sync (each worker keeps its own session)."""
    state, ctl = _admin(request)
    raw, _ = await _object(request)
    results = await _broadcast(state, ctl.pool, "POST", request.path, raw)
    return answer(request.path.removeprefix("/"), "control_failed", results)


async def update_weight_version(request: web.Request) -> web.Response:
    state, ctl = _admin(request)
    raw, body = await _object(request, ("new_version",))
    version = _version_field(body, "new_version")
    pool = ctl.pool
    async with ctl.lock:
        pool.sync_epoch += 1
        members = _members(pool)
        replies = await fan_out(
            state,
            [ep.url for ep in members],
            "POST",
            request.path,
            raw,
            state.config.control.timeout_s,
        )
        ok = [r.ok for r in replies]
        if any(ok):  # refused everywhere: the pool keeps its version and its rotation
            _set_pool_version(state, pool, members, ok, version)
    ok_body = {"new_version": version, "message": f"Weight version updated to {version}"}
    return answer(
        "update_weight_version", "weight_sync_failed", [r.result() for r in replies], ok_body
    )


def _set_pool_version(
    state: GatewayState, pool: Pool, members: list[Endpoint], ok: list[bool], version: str
) -> None:
    pool.version = version
    for ep, reply_ok in zip(members, ok, strict=True):
        if reply_ok:
            ep.stale, ep.rejoin = False, True
            set_version(state, pool, ep, version)
        else:
            ep.stale, ep.rejoin = True, True
    for ep in pool.endpoints:
        if ep not in members:
            ep.stale, ep.rejoin = True, True


async def init_group(request: web.Request) -> web.Response:
    """Ranks `rank_offset + i` (the trainer's offset, 1 by default) for the i-th endpoint;
    every init runs at once, since each blocks until the trainer joins. No lock, no hold:
    other traffic flows while the endpoints wait."""
    state, ctl = _admin(request)
    _, body = await _object(request, ("master_address", "master_port", "world_size"))
    members = _members(ctl.pool)
    base, world = body.get("rank_offset", 1), body["world_size"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (base, world)):
        raise ApiError("invalid_request", "world_size and rank_offset must be integers")
    if base < 1 or base + len(members) > world:
        raise ApiError(
            "world_size_mismatch",
            f"the pool has {len(members)} ranks: with rank_offset {base} world_size must be at "
            f"least {base + len(members)} (the trainer's ranks + the pool's), got {world}",
            param="world_size",
        )
    urls = [ep.url for ep in members]
    group = body.get("group_name", "weight_update_group")

    def with_rank(i: int, url: str) -> bytes:
        return orjson.dumps({**body, "rank_offset": base + i})

    replies = await fan_out(
        state, urls, "POST", request.path, with_rank, state.config.control.timeout_s
    )
    results = [r.result(rank_offset=base + i) for i, r in enumerate(replies)]
    if all(r.ok for r in replies):
        ctl.groups[group] = urls
    return answer("init_weights_update_group", "control_failed", results)


async def destroy_group(request: web.Request) -> web.Response:
    state, ctl = _admin(request)
    raw, body = await _object(request)
    group = body.get("group_name", "weight_update_group")
    urls = ctl.groups.pop(group, None) or [ep.url for ep in _members(ctl.pool)]
    replies = await fan_out(state, urls, "POST", request.path, raw, state.config.control.timeout_s)
    return answer("destroy_weights_update_group", "control_failed", [r.result() for r in replies])


def _versions(pool: Pool) -> dict[str, Any]:
    serving = [ep for ep in pool.endpoints if ep.usable()]
    return {
        "weight_version": pool_version(ep.weight_version for ep in serving),
        "pool_weight_version": pool.version,
        "endpoints": [
            {"url": ep.url, "weight_version": ep.weight_version, "serving": ep.usable()}
            for ep in pool.endpoints
        ],
    }


async def get_weight_version(request: web.Request) -> web.Response:
    return json_response(_versions(request.app[CONTROL].pool))


async def get_world_size(request: web.Request) -> web.Response:
    """The pool's ranks (one per endpoint, TP=1): the trainer's world_size is 1 + this."""
    pool = request.app[CONTROL].pool
    members = [ep.url for ep in pool.endpoints if ep.healthy is not False]
    return json_response(
        {"world_size": len(members), "num_ranks": len(members), "endpoints": members}
    )


async def model_info(request: web.Request) -> web.Response:
    """One serving endpoint's `/model_info`, with the pool's version (or "mixed") instead of
    that endpoint's own."""
    state = request.app[STATE]
    pool = request.app[CONTROL].pool
    info: dict[str, Any] = {}
    for ep in [ep for ep in pool.endpoints if ep.usable()]:  # the first that answers
        reply = await call(state, ep.url, "GET", "/model_info", None, _INFO_TIMEOUT_S)
        data = reply.json()
        if reply.status == 200 and isinstance(data, dict):
            info = data
            break
    if not info:
        raise _no_trained(f"no endpoint of the trained pool ({pool.name}) answered /model_info")
    versions = _versions(pool)
    info["weight_version"] = versions["weight_version"]
    info["weight_version_mixed"] = versions["weight_version"] == MIXED
    info["weight_versions_by_endpoint"] = {
        e["url"]: e["weight_version"] for e in versions["endpoints"]
    }
    info["num_ranks"] = sum(1 for ep in pool.endpoints if ep.healthy is not False)
    return json_response(info)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The route table's control rows (routes.py) are made from these.
POST_HANDLERS: dict[str, Handler] = {
    **dict.fromkeys(UPDATE_PATHS, update_weights),
    "/pause_generation": pause_generation,
    "/continue_generation": continue_generation,
    "/abort_request": to_every_endpoint,
    "/begin_weight_update": to_every_endpoint,
    "/end_weight_update": to_every_endpoint,
    "/update_weight_version": update_weight_version,
    "/init_weights_update_group": init_group,
    "/destroy_weights_update_group": destroy_group,
}
GET_OR_POST_HANDLERS: dict[str, Handler] = {
    "/flush_cache": flush_cache,
    "/release_memory_occupation": release_memory,
    "/resume_memory_occupation": resume_memory,
}
GET_HANDLERS: dict[str, Handler] = {
    "/model_info": model_info,
    "/get_model_info": model_info,
    "/get_weight_version": get_weight_version,
    "/weight_version": get_weight_version,
    "/get_world_size": get_world_size,
}
CHANGING_GET_PATHS = tuple(GET_OR_POST_HANDLERS)  # a GET of these changes state too


def install_control(app: web.Application) -> None:
    """The trained pool's control state, shared by the control rows' handlers."""
    state = app[STATE]
    ctl = PoolControl(
        state.pools[state.config.control.trained_pool], state.config.control.hold_deadline_s
    )

    async def release(reason: str) -> None:  # an expired trainer hold: resume the endpoints
        path = "/continue_generation" if reason == "paused" else "/resume_memory_occupation"
        urls = [ep.url for ep in ctl.pool.endpoints if ep.healthy is not False]
        await fan_out(state, urls, "POST", path, b"{}", state.config.control.timeout_s)

    ctl.release = release
    ctl.on_expired = lambda reason: state.metrics.control_hold_expired.labels(reason).inc()
    app[CONTROL] = ctl

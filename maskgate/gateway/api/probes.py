"""The gateway's own answers: liveness, readiness, Prometheus metrics, the API description,
and the 404 / 405 of paths and methods the route table does not declare."""

from __future__ import annotations

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from maskgate.gateway.state import STATE
from maskgate.protocol.errors import ApiError

OPENAPI_BODY = web.AppKey("maskgate_openapi_body", bytes)  # serialised once per app


async def healthz(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.ready:
        return web.Response(body=b'{"status":"ready"}', content_type="application/json")
    status = "draining" if state.draining else "starting"
    return web.Response(
        status=503, body=orjson.dumps({"status": status}), content_type="application/json"
    )


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI_BODY], content_type="application/json")


async def not_found(request: web.Request) -> web.Response:
    raise ApiError("not_found", f"no route {request.method} {request.path}", status=404)


def method_not_allowed(path: str, methods: tuple[str, ...]) -> ApiError:
    allowed = ", ".join(methods)
    return ApiError(
        "method_not_allowed",
        f"{path} takes {allowed}, not this method",
        status=405,
        headers={"Allow": allowed},
    )

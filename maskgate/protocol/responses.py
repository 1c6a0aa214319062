"""The JSON answers of the gateway's and the worker's own handlers: one body renderer for
data and one for errors (an ApiError as its OpenAI-style body, docs/design.md, Policy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from maskgate.protocol.errors import ApiError


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


def error_response(err: ApiError) -> web.Response:
    return web.Response(
        status=err.status, body=err.to_bytes(), content_type="application/json", headers=err.headers
    )

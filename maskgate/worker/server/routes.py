"""The worker's one route table: every route, its methods, handler and access level.

Nothing else registers routes: `register` adds each row (no implicit HEAD), wrapping its
handler in the key check of its access level (auth.py). A path or method that is not here
answers 404 / 405. Rows follow SGLang's http_server.py: native routes, then RL control, then
the OpenAI API. docs/worker.md lists them, with the SGLang routes this worker does not serve.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from maskgate.worker.server import (
    control,
    generate,
    health,
    info,
    openai,
    tokens,
    weight_routes,
    weight_session,
)
from maskgate.worker.server.auth import Access, Keys, check_access

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC, NORMAL, ADMIN = Access.PUBLIC, Access.NORMAL, Access.ADMIN_OPTIONAL
GET, POST, PUT = ("GET",), ("POST",), ("POST", "PUT")
GET_POST = ("GET", "POST")


@dataclass(frozen=True, slots=True)
class Row:
    methods: tuple[str, ...]
    path: str
    handler: Handler
    access: Access


ROUTES: tuple[Row, ...] = (
    # Native: health and facts.
    Row(GET, "/health", health.handle_health, PUBLIC),
    Row(GET, "/health_generate", health.handle_health_generate, PUBLIC),
    Row(GET, "/model_info", control.handle_model_info, NORMAL),
    Row(GET, "/get_model_info", control.handle_model_info, NORMAL),
    Row(GET, "/server_info", info.handle_server_info, NORMAL),
    Row(GET, "/get_server_info", info.handle_server_info, NORMAL),
    Row(GET, "/get_load", info.handle_get_load, NORMAL),
    Row(GET, "/v1/loads", info.handle_loads, NORMAL),
    Row(GET, "/get_weight_version", weight_routes.handle_weight_version, NORMAL),
    Row(GET, "/weight_version", weight_routes.handle_weight_version, NORMAL),
    # Native: generation.
    Row(PUT, "/generate", generate.handle_generate, NORMAL),
    # RL control.
    Row(GET_POST, "/flush_cache", control.handle_flush_cache, ADMIN),
    Row(POST, "/update_weights_from_disk", weight_routes.handle_update_from_disk, ADMIN),
    Row(POST, "/init_weights_update_group", weight_routes.handle_init_group, ADMIN),
    Row(POST, "/destroy_weights_update_group", weight_routes.handle_destroy_group, ADMIN),
    Row(POST, "/update_weights_from_tensor", weight_routes.handle_update_from_tensor, ADMIN),
    Row(
        POST,
        "/update_weights_from_distributed",
        weight_routes.handle_update_from_distributed,
        ADMIN,
    ),
    Row(POST, "/update_weight_version", weight_routes.handle_update_weight_version, ADMIN),
    Row(POST, "/begin_weight_update", weight_session.handle_begin, ADMIN),
    Row(POST, "/end_weight_update", weight_session.handle_end, ADMIN),
    Row(GET_POST, "/get_weights_by_name", weight_session.handle_get_weights_by_name, ADMIN),
    Row(POST, "/update_weights_from_ipc", weight_session.handle_update_from_ipc, ADMIN),
    Row(GET_POST, "/release_memory_occupation", control.handle_release_memory, ADMIN),
    Row(GET_POST, "/resume_memory_occupation", control.handle_resume_memory, ADMIN),
    Row(POST, "/abort_request", control.handle_abort_request, ADMIN),
    Row(POST, "/pause_generation", control.handle_pause, ADMIN),
    Row(POST, "/continue_generation", control.handle_continue, ADMIN),
    # OpenAI.
    Row(POST, "/v1/completions", openai.handle_completions, NORMAL),
    Row(POST, "/v1/chat/completions", openai.handle_chat, NORMAL),
    Row(POST, "/v1/tokenize", tokens.handle_tokenize, NORMAL),
    Row(POST, "/tokenize", tokens.handle_tokenize, NORMAL),
    Row(POST, "/v1/detokenize", tokens.handle_detokenize, NORMAL),
    Row(POST, "/detokenize", tokens.handle_detokenize, NORMAL),
    Row(GET, "/v1/models", info.handle_models, NORMAL),
    # Prometheus.
    Row(GET, "/metrics", info.handle_metrics, PUBLIC),
)


def register(app: web.Application, keys: Keys) -> None:
    for row in ROUTES:
        handler = _guarded(row.handler, row.access, keys)
        for method in row.methods:
            app.router.add_route(method, row.path, handler)


def _guarded(handler: Handler, access: Access, keys: Keys) -> Handler:
    if access is Access.PUBLIC:
        return handler

    async def guarded(request: web.Request) -> web.StreamResponse:
        check_access(access, request.headers, keys)  # before the body is read
        return await handler(request)

    return guarded

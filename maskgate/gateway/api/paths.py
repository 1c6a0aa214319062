"""The OpenAPI operations of the gateway's paths whose answers it documents in detail (the
inference routes, the admin API, the RL control plane), keyed by path; openapi.py builds the
document from the route table and takes each row's operation from here when there is one."""

from __future__ import annotations

from typing import Any

from maskgate.gateway.api.control_paths import control_paths


def error_ref() -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _responses(ok: str, statuses: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "200": {
            "description": ok,
            "content": {
                "application/json": {"schema": {"type": ["object", "array"]}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
    }
    why = {
        400: "The request breaks the mask policy (rules 1, 3-9) or is not valid JSON.",
        401: "Missing or invalid API key.",
        405: "The route does not take this method (see Allow).",
        415: "A Content-Encoding other than gzip or deflate.",
        403: "This key may not ask for masks (rule 2).",
        413: "The body is over the size limit.",
        429: "The pool's admission queue is full (rule 10); see Retry-After.",
        502: "The upstream failed or could not be reached.",
        503: "No healthy endpoint (mask_pool_unavailable), queue timeout, or upstream 503.",
        504: "The upstream sent no response within the first-byte timeout.",
    }
    for status in statuses:
        out[str(status)] = {"description": why[status], **error_ref()}
    return out


_INFERENCE_STATUSES = (400, 401, 403, 405, 413, 415, 429, 502, 503, 504)


def _post(
    summary: str, schema: str, ok: str, methods: tuple[str, ...] = ("post",)
) -> dict[str, Any]:
    return {
        method: {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}
                },
            },
            "responses": _responses(ok, _INFERENCE_STATUSES),
        }
        for method in methods
    }


def _get(summary: str, content_type: str = "application/json") -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "responses": {"200": {"description": summary, "content": {content_type: {}}}},
        }
    }


ENDPOINT_LIST = {
    "type": "object",
    "description": 'One URL or several: {"url": "http://host:port"} or {"urls": [...]} '
    "(or ?url=... query parameters). URLs carry no path.",
    "properties": {
        "url": {"type": "string"},
        "urls": {"type": "array", "items": {"type": "string"}},
    },
    "anyOf": [{"required": ["url"]}, {"required": ["urls"]}],
}


def _admin_endpoints() -> dict[str, Any]:
    body = {
        "required": False,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EndpointList"}}},
    }
    pool = {
        "name": "pool",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "enum": ["general", "mask"]},
    }
    errors = {
        "400": {"description": "invalid_endpoint or invalid_json", **error_ref()},
        "401": {"description": "Missing or invalid (admin) key.", **error_ref()},
        "404": {"description": "unknown_pool, or unknown_endpoint on DELETE", **error_ref()},
    }
    return {
        "parameters": [pool],
        "post": {
            "summary": "Add endpoints at run time (RL frameworks register rollout servers)",
            "requestBody": body,
            "responses": {
                "201": {"description": "Added; the pool as it is now"},
                "200": {"description": "Already present; nothing changed"},
                **errors,
            },
        },
        "delete": {
            "summary": "Remove endpoints; requests already sent to them finish",
            "requestBody": body,
            "responses": {"200": {"description": "Removed; the pool as it is now"}, **errors},
        },
    }


DOCUMENTED: dict[str, Any] = {
    "/v1/chat/completions": _post(
        "OpenAI chat completion",
        "ChatCompletionRequest",
        "The upstream's answer (masks in choices[i].meta_info), or an SSE stream.",
    ),
    "/v1/completions": _post(
        "OpenAI text completion",
        "CompletionRequest",
        "The upstream's answer (masks in choices[i].meta_info), or an SSE stream.",
    ),
    "/generate": _post(
        "SGLang native generation (single or batch); PUT takes the same body",
        "GenerateRequest",
        "The upstream's answer (masks in meta_info; a list for a batch), or an SSE stream.",
        methods=("post", "put"),
    ),
    "/v1/models": _get("Models served by the general pool"),
    "/healthz": _get("Liveness: 200 while the process serves"),
    "/readyz": _get("Readiness: 200 while accepting traffic, 503 once draining"),
    "/metrics": _get("Prometheus metrics (prefix maskgate_)", "text/plain"),
    "/openapi.json": _get("This document"),
    "/admin/pools": _get("Pools, their endpoints, health, in-flight and circuit state"),
    "/admin/pools/{pool}/endpoints": _admin_endpoints(),
    **control_paths(),  # the RL control plane (docs/rl.md)
}
INVOCATIONS = "SageMaker's path for chat completions (the same body; sent upstream as chat)"

"""The OpenAPI description of the RL control plane's paths (control.py, registration.py) and
its error codes, merged into the gateway's document by openapi.py. Bodies are SGLang's and are
left open here: the workers validate them (docs/rl.md)."""

from __future__ import annotations

from typing import Any

CONTROL_CODES = (
    "weight_sync_failed",
    "flush_cache_failed",
    "control_failed",
    "no_trained_endpoints",
    "world_size_mismatch",
    "missing_field",
    "invalid_json",
    "invalid_request",
    "invalid_mode",
    "invalid_weight_version",
    "weight_version_unavailable",
    "invalid_min_weight_version",
    "unsupported_worker_type",
    "worker_not_found",
    "control_leader_unavailable",
)

_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_BODY = {
    "required": False,
    "content": {"application/json": {"schema": {"type": "object"}}},
}


def _fan_out(summary: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": _BODY,
        "responses": {
            "200": {"description": "Every endpoint succeeded; `endpoints` lists each result"},
            "400": {"description": "Every endpoint refused it, or a bad body", **_ERROR},
            "401": {
                "description": "Outside trusted_networks without the admin key",
                **_ERROR,
            },
            "403": {
                "description": "control_forbidden: outside trusted_networks, no admin key "
                "configured",
                **_ERROR,
            },
            "502": {"description": "Some endpoints failed: `endpoints` says which", **_ERROR},
            "503": {
                "description": "no_trained_endpoints; control_leader_unavailable (workers > 1)",
                **_ERROR,
            },
        },
    }


def _read(summary: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "responses": {
            "200": {"description": summary},
            "401": {"description": "Missing or invalid API key", **_ERROR},
        },
    }


_SYNC = (
    "Fleet-wide weight sync of the trained pool: new requests held while it runs, in-flight "
    "ones left running unless control.pause_mode pauses the endpoints; a sync no endpoint "
    "took leaves the pool as it was"
)
_FAN_OUT = {
    "/update_weights_from_disk": _SYNC,
    "/update_weights_from_distributed": _SYNC + "; sent to every rank of the group at once",
    "/update_weights_from_tensor": _SYNC,
    "/init_weights_update_group": "One rank per endpoint (rank_offset + i), all at once",
    "/destroy_weights_update_group": "Destroy the group on its endpoints",
    "/pause_generation": "Pause every endpoint; the pool's new requests wait at the gateway",
    "/continue_generation": "Continue every endpoint; lifts every hold; held requests go on",
    "/abort_request": "Abort a rid, or all (abort_all), on every endpoint",
    "/begin_weight_update": "Open a weight-update session on every endpoint (Miles)",
    "/end_weight_update": "Close the weight-update session on every endpoint (Miles)",
    "/update_weight_version": "Set the weight version on every endpoint and the pool",
}
_GET_OR_POST = {
    "/flush_cache": "Flush every endpoint's cache once (400 while any is busy)",
    "/release_memory_occupation": "Release memory on every endpoint; the pool is held",
    "/resume_memory_occupation": "Resume memory on every endpoint; held requests go on",
}
_READS = {
    "/model_info": "One endpoint's model info with the pool's weight_version (or mixed)",
    "/get_weight_version": "The pool's weight version and each endpoint's",
    "/get_world_size": "The trained pool's ranks (one per endpoint)",
    "/v1/loads": "Every endpoint's load",
    "/get_loads": "Every endpoint's load (older name)",
}
_ADMIN = {
    "/workers": {
        "post": _fan_out("Register a worker in the trained pool (202, Location)"),
        "get": _read("Every pool's workers"),
    },
    "/workers/{worker_id}": {
        "parameters": [
            {"name": "worker_id", "in": "path", "required": True, "schema": {"type": "string"}}
        ],
        "get": _read("One worker (404 worker_not_found)"),
        "delete": _read("Remove a worker from its pool (202)"),
    },
    "/add_worker": {"post": _read("Register ?url= in the trained pool (older routers)")},
    "/remove_worker": {"post": _read("Remove ?url= (older routers)")},
    "/list_workers": {"get": _read("Every pool's worker URLs (older routers)")},
}


def control_paths() -> dict[str, Any]:
    paths: dict[str, Any] = {p: {"post": _fan_out(s)} for p, s in _FAN_OUT.items()}
    for path, summary in _GET_OR_POST.items():
        paths[path] = {"post": _fan_out(summary), "get": _fan_out(summary)}
    paths.update({p: {"get": _read(s)} for p, s in _READS.items()})
    paths.update(_ADMIN)
    return paths

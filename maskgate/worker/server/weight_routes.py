"""SGLang's weight-update endpoints: from disk, from a trainer's broadcast (with the group's
init and destroy), from a co-located trainer's shared tensors, the weight version, and the
weight-update session and read-out routes (`weight_session.py`).

An update is checked whole, staged off the event loop, then copied in between two engine
steps (`WeightSync.apply`); one update runs at a time. A refused update answers SGLang's
`{"success": false, "message"}` with 400 and changes nothing. A malformed body is a 400 with
the OpenAI-style error body, like every other bad request to this worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from maskgate.protocol.errors import ApiError
from maskgate.protocol.responses import json_response
from maskgate.worker.server.control_body import Body
from maskgate.worker.server.params import invalid
from maskgate.worker.server.state import STATE, WorkerState

LOAD_FORMATS = (None, "direct", "flattened_bucket", "safetensors")  # tensor_decode's

DEFAULT_GROUP = "weight_update_group"
MAX_WORLD_SIZE = 1024
SELECTORS = ("all", "target")


def _state(request: web.Request) -> WorkerState:
    return request.app[STATE].get()


async def on_engine(state: WorkerState, fn: Callable[[], Any]) -> Any:
    """Run `fn` on the engine thread between two steps and wait for it."""
    if not state.engine.alive:
        raise ApiError("worker_unavailable", "the engine is not running", status=503)
    return await asyncio.wrap_future(state.engine.between_steps(fn))


def abort_all(state: WorkerState, why: str) -> Callable[[], int]:
    return lambda: state.engine.abort_where(lambda _s: True, why)


async def _update(
    state: WorkerState,
    stage: Callable[[], Any],
    *,
    version: str | None,
    abort: bool,
    ok: str,
    extra: dict[str, Any],
) -> web.Response:
    from maskgate.worker.rl.weight_group import GroupError
    from maskgate.worker.rl.weights import WeightUpdateError

    sync = state.sync
    async with state.update_lock:
        try:
            if "weights" in sync.memory.held:
                raise WeightUpdateError(
                    "the weights are released (/release_memory_occupation); "
                    "call /resume_memory_occupation first"
                )
            if abort:
                await on_engine(state, abort_all(state, "aborted by a weight update"))
            staged = await asyncio.to_thread(stage)
            await on_engine(state, lambda: sync.apply(staged, version))
        except (WeightUpdateError, GroupError) as e:
            msg = f"Failed to update weights: {e}. The old weights keep serving."
            return json_response({"success": False, "message": msg, **extra}, status=400)
    if version is not None:
        ok += f" Weight version updated to {version}."
    return json_response({"success": True, "message": ok, **extra})


def _common(body: Body) -> tuple[str | None, bool]:
    """Fields every update takes: weight_version, abort_all_requests; flush_cache and
    torch_empty_cache are accepted (every update empties the prefix cache; docs/worker.md)."""
    body.boolean("flush_cache", True)
    body.boolean("torch_empty_cache", False)
    body.refuse("selector", SELECTORS, "draft-model weights")
    return body.string("weight_version"), body.boolean("abort_all_requests", False)


async def handle_update_from_disk(request: web.Request) -> web.Response:
    state, body = _state(request), await Body.read(request)
    path = body.string("model_path", required=True)
    body.refuse("load_format", ("auto", "safetensors"), "load formats other than safetensors")
    body.refuse("is_async", (False,), "asynchronous loading")
    body.refuse("manifest", (), "weight manifests")
    body.boolean("keep_pause", False)
    body.boolean("recapture_cuda_graph", False)  # in-place copies keep the graphs valid
    version, abort = _common(body)
    resp = await _update(
        state,
        lambda: state.sync.stage_disk(path),
        version=version,
        abort=abort,
        ok="Succeeded to update model weights.",
        extra={"num_paused_requests": 0},
    )
    if resp.status == 200:
        state.sync.model_path = path  # /get_model_info reports it, as SGLang does
    return resp


async def handle_init_group(request: web.Request) -> web.Response:
    from maskgate.worker.rl.weight_group import GroupError

    state, body = _state(request), await Body.read(request)
    address = body.string("master_address", required=True)
    port = body.integer("master_port", minimum=1, maximum=65535)
    world_size = body.integer("world_size", minimum=2)
    if world_size > MAX_WORLD_SIZE:
        raise ApiError(
            "world_size_too_large",
            f"world_size {world_size} is over this worker's limit of {MAX_WORLD_SIZE} ranks",
            param="world_size",
        )
    rank = body.integer("rank_offset", minimum=1, maximum=world_size - 1)
    name = body.string("group_name", DEFAULT_GROUP)
    backend = body.string("backend", "nccl")
    async with state.update_lock:
        try:
            await asyncio.to_thread(
                state.sync.init_group, address, port, rank, world_size, name, backend
            )
        except GroupError as e:
            msg = f"Failed to initialize custom process group: {e}."
            return json_response({"success": False, "message": msg}, status=400)
    return json_response(
        {"success": True, "message": "Succeeded to initialize custom process group."}
    )


async def handle_destroy_group(request: web.Request) -> web.Response:
    state, body = _state(request), await Body.read(request)
    name = body.string("group_name", DEFAULT_GROUP)
    async with state.update_lock:
        found = await asyncio.to_thread(state.sync.destroy_group, name)
    if not found:
        msg = "The group to be destroyed does not exist."
        return json_response({"success": False, "message": msg}, status=400)
    return json_response({"success": True, "message": "Succeeded to destroy custom process group."})


async def handle_update_from_distributed(request: web.Request) -> web.Response:
    from maskgate.worker.rl.weights import parse_dtype

    state, body = _state(request), await Body.read(request)
    name = body.data.get("group_name") or DEFAULT_GROUP
    try:
        body.string("group_name", DEFAULT_GROUP)
        names = body.string_list("names")
        dtype_names = body.string_list("dtypes")
        shapes = body.shapes("shapes")
        assert names is not None and dtype_names is not None
        if not len(names) == len(dtype_names) == len(shapes):
            raise invalid("names", "dtypes and shapes must have the same length")
        body.refuse("load_format", ("direct",), "load formats other than the default")
        version, abort = _common(body)
    except ApiError:
        if isinstance(name, str):
            await _leave_group(state, name)
        raise

    def stage() -> Any:
        dtypes = [parse_dtype(d) for d in dtype_names]
        return state.sync.receive(name, names, dtypes, shapes)

    resp = await _update(
        state,
        stage,
        version=version,
        abort=abort,
        ok="Succeeded to update parameter online.",
        extra={},
    )
    if resp.status != 200:
        await _leave_group(state, name)
    return resp


async def _leave_group(state: WorkerState, name: str) -> None:
    """A failed update_weights_from_distributed: the trainer is broadcasting (or was) and
    the two sides cannot be resynchronised, so the worker leaves the group; the trainer's
    pending broadcasts then fail and it forms a new group (docs/worker.md)."""
    async with state.update_lock:
        await asyncio.to_thread(state.sync.destroy_group, name)


async def handle_update_from_tensor(request: web.Request) -> web.Response:
    state, body = _state(request), await Body.read(request)
    payloads = body.data.get("serialized_named_tensors")
    if not isinstance(payloads, list) or not payloads or not isinstance(payloads[0], str):
        raise invalid(
            "serialized_named_tensors",
            "must be a list whose entry 0 is a string (this worker is one rank)",
        )
    load_format = body.data.get("load_format")
    body.refuse("load_format", LOAD_FORMATS[1:], "this load format")
    version, abort = _common(body)
    return await _update(
        state,
        lambda: state.sync.stage_tensors(payloads[0], load_format),
        version=version,
        abort=abort,
        ok="Succeeded to update model weights.",
        extra={},
    )


async def handle_update_weight_version(request: web.Request) -> web.Response:
    state, body = _state(request), await Body.read(request)
    version = body.string("new_version", required=True)
    abort = body.boolean("abort_all_requests", True)

    def set_version() -> None:
        if abort:
            abort_all(state, "aborted by /update_weight_version")()
        state.engine.weight_version = version

    async with state.update_lock:
        await on_engine(state, set_version)
    msg = f"Weight version updated to {version}"
    return json_response({"success": True, "message": msg, "new_version": version})


async def handle_weight_version(request: web.Request) -> web.Response:
    return json_response({"weight_version": _state(request).engine.weight_version})

"""SGLang's generation-control endpoints: pause / continue, abort by rid or all, flush_cache,
releasing and restoring memory for a co-located trainer, and /model_info.

Every state change runs on the engine thread between two steps (`on_engine`), so it never
lands in the middle of a forward.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web

from maskgate.protocol.errors import ApiError
from maskgate.protocol.responses import json_response
from maskgate.worker.engine.sequence import Sequence
from maskgate.worker.server.control_body import Body
from maskgate.worker.server.params import invalid
from maskgate.worker.server.state import STATE, WorkerState
from maskgate.worker.server.weight_routes import abort_all, on_engine

PAUSE_MODES = ("abort", "retract", "in_place")
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
FLUSH_POLL_S = 0.05
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)


def _state(request: web.Request) -> WorkerState:
    return request.app[STATE].get()


def _ok(message: str) -> web.Response:
    return web.json_response({"message": message, "status": "ok"})


async def handle_pause(request: web.Request) -> web.Response:
    state, body = _state(request), await Body.read(request)
    mode = body.string("mode", "abort")
    if mode not in PAUSE_MODES:
        raise invalid("mode", f"must be one of {list(PAUSE_MODES)}, got {mode!r}")
    await on_engine(state, lambda: state.engine.pause(mode))
    return _ok("Generation paused successfully.")


async def handle_continue(request: web.Request) -> web.Response:
    state = _state(request)
    await Body.read(request)  # torch_empty_cache and the like: accepted, nothing to do
    await on_engine(state, state.engine.resume)
    return _ok("Generation continued successfully.")


async def handle_abort_request(request: web.Request) -> web.Response:
    """200 with an empty body whatever was found (as SGLang): an unknown rid is a no-op."""
    state, body = _state(request), await Body.read(request)
    rid = body.string("rid", "")
    if body.boolean("abort_all", False):
        await on_engine(state, abort_all(state, "aborted by /abort_request"))
    elif rid:
        message = body.string("abort_message") or "aborted by /abort_request"
        await on_engine(state, lambda: state.engine.abort_where(_rid_match(rid), message))
    return web.Response(status=200)


def _rid_match(rid: str) -> Callable[[Sequence], bool]:
    """A request's sequences: `rid` itself, or `rid-<k>` (its n choices / batch items)."""

    def match(seq: Sequence) -> bool:
        base, _, k = seq.rid.rpartition("-")
        return seq.rid == rid or (base == rid and k.isdigit())

    return match


async def handle_flush_cache(request: web.Request) -> web.Response:
    """400 while any request is queued or running (SGLang's retry loops poll for 200); once
    idle, empties the prefix cache. `?timeout=S` waits up to S seconds for idle."""
    state = _state(request)

    def flush() -> bool:  # engine thread: True while busy
        sched = state.engine.scheduler
        if sched.has_work():
            return True
        sched.flush_cache()
        return False

    raw = request.query.get("timeout", "0")
    try:
        timeout = float(raw)
    except ValueError:
        raise invalid("timeout", f"must be a number of seconds, got {raw!r}") from None
    if not 0 <= timeout < float("inf"):
        raise invalid("timeout", f"must be >= 0, got {raw!r}")
    deadline = time.monotonic() + timeout
    while True:
        busy = await on_engine(state, flush)
        if not busy:
            return web.Response(text=FLUSHED)
        if time.monotonic() >= deadline:
            sched = state.engine.scheduler
            return web.Response(
                status=400,
                text=f"Flush cache failed: {sched.num_running} running and "
                f"{sched.num_waiting} waiting requests.\n",
            )
        await asyncio.sleep(FLUSH_POLL_S)


async def _memory_tags(request: web.Request) -> list[str] | None:
    """The named tags; None (no `tags`) means every tag."""
    body = await Body.read(request)
    tags = body.string_list("tags", required=False)
    if tags is None or not tags:
        return None
    bad = [t for t in tags if t not in MEMORY_TAGS]
    if bad:
        raise invalid("tags", f"holds unknown tags {bad}; known: {list(MEMORY_TAGS)}")
    return tags


async def _change_memory(state: WorkerState, change: Callable[[], None]) -> web.Response:
    """`change` on the engine thread under the update lock; the engine then sees which
    memory is held."""

    def run() -> None:
        change()
        state.engine.held = state.sync.memory.held

    async with state.update_lock:
        await on_engine(state, run)
    return web.json_response(None)


async def handle_release_memory(request: web.Request) -> web.Response:
    state, tags = _state(request), await _memory_tags(request)

    def release() -> None:
        if state.engine.scheduler.has_work():
            raise ApiError(
                "worker_busy",
                "requests are running or queued; pause generation (mode abort) or wait for "
                "them before releasing memory",
                status=400,
            )
        changed = _check_memory_state(state, tags, releasing=True)
        state.sync.memory.release(changed)
        if "kv_cache" in changed:
            state.engine.scheduler.flush_cache()

    return await _change_memory(state, release)


async def handle_resume_memory(request: web.Request) -> web.Response:
    state, tags = _state(request), await _memory_tags(request)

    def resume() -> None:
        state.sync.memory.resume(_check_memory_state(state, tags, releasing=False))

    return await _change_memory(state, resume)


def _check_memory_state(
    state: WorkerState, tags: list[str] | None, *, releasing: bool
) -> list[str]:
    """The tags to change. A named tag released twice, or resumed while not released, is an
    error (as in SGLang); with no tags named, only a change with nothing to do is one."""
    memory = state.sync.memory
    named = list(MEMORY_TAGS) if tags is None else tags
    bad = memory.conflicts(named, releasing=releasing)
    if tags is None and len(bad) < len(memory.tags):
        return named
    if bad:
        code, what = (
            ("memory_already_released", "already released")
            if releasing
            else ("memory_not_released", "not released")
        )
        raise ApiError(code, f"memory {bad} is {what}; nothing was changed", param="tags")
    return named


async def handle_model_info(request: web.Request) -> web.Response:
    state = _state(request)
    cfg = state.runner_config
    info = {
        "model_path": state.sync.model_path or state.config.model,
        "tokenizer_path": state.config.model,
        "served_model_name": state.model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": state.engine.weight_version,
        "load_format": "auto",
        "model_type": cfg.get("model_type"),
        "architectures": cfg.get("architectures"),
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "vocab_size": state.vocab_size,
        "max_model_len": state.max_model_len,
        "max_num_seqs": state.engine.scheduler.max_num_seqs,
        "role": state.config.role,
        "max_mask_tokens": state.config.max_mask_tokens,
        "paused": state.engine.paused,
        "released_memory": sorted(state.engine.held),
    }
    return json_response(info)

"""What the worker says about itself: `/v1/models`, `/metrics`, SGLang's `/server_info` (and
`/get_server_info`), `/v1/loads` and `/get_load`.

`/server_info` carries the SGLang server arguments RL frameworks read from a pre-launched
engine (slime's external-engine mode: the parallel sizes, `disaggregation_mode`,
`encoder_only`, `enable_memory_saver`, `dtype`), filled with this worker's real settings,
plus the worker's own. Keys are never part of it.

Loads are read on the engine thread between two steps, so the counts are one consistent
snapshot of the scheduler.
"""

from __future__ import annotations

import importlib.metadata
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from maskgate.protocol.errors import ApiError
from maskgate.protocol.responses import json_response
from maskgate.worker.engine.engine import Engine
from maskgate.worker.server.params import invalid
from maskgate.worker.server.state import STATE, WorkerState
from maskgate.worker.server.weight_routes import on_engine

# SGLang's /v1/loads sections; the ones this worker has no metrics for are accepted and left
# out of the answer, as SGLang leaves out sections that do not apply.
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def _version() -> str:
    try:
        return importlib.metadata.version("maskgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


VERSION = _version()


def _state(request: web.Request) -> WorkerState:
    return request.app[STATE].get()


async def handle_models(request: web.Request) -> web.Response:
    state = _state(request)
    model = {
        "id": state.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "maskgate",
        "root": state.model_name,
        "max_model_len": state.max_model_len,
    }
    return json_response({"object": "list", "data": [model]})


async def handle_metrics(request: web.Request) -> web.Response:
    body = _state(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def handle_server_info(request: web.Request) -> web.Response:
    state = _state(request)
    cfg, engine = state.config, state.engine
    info: dict[str, Any] = {
        # SGLang's server arguments, as this worker runs them.
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "served_model_name": state.model_name,
        "host": cfg.host,
        "port": cfg.port,
        "dtype": cfg.dtype,
        "device": state.runner_config.get("device"),
        "tp_size": 1,
        "pp_size": 1,
        "dp_size": 1,
        "ep_size": 1,
        "moe_dp_size": 1,
        "nnodes": 1,
        "node_rank": 0,
        "disaggregation_mode": "null",
        "encoder_only": False,
        "is_embedding": False,
        "skip_tokenizer_init": False,
        # SGLang's default. Releasing and resuming memory works here regardless.
        "enable_memory_saver": False,
        "context_length": state.max_model_len,
        "max_running_requests": engine.scheduler.max_num_seqs,
        "chunked_prefill_size": cfg.max_prefill_tokens,
        "max_total_num_tokens": _capacity(state),
        "max_req_input_len": state.max_model_len - 1,
        "weight_version": engine.weight_version,
        "enable_metrics": True,
        "version": VERSION,
        "internal_states": [{"paused": engine.paused, "released_memory": sorted(engine.held)}],
        # The worker's own.
        "role": cfg.role,
        "vocab_size": state.vocab_size,
        "max_mask_tokens": cfg.max_mask_tokens,
        "mask_impl": cfg.mask_impl,
        "cuda_graphs": cfg.cuda_graphs,
        "fused_kernels": cfg.fused_kernels,
        "incremental_streaming_output": cfg.incremental_streaming_output,
        "max_body_bytes": cfg.max_body_bytes,
        "max_sequences_per_request": cfg.max_sequences_per_request,
        "max_prompt_bytes": cfg.max_prompt_bytes,
        "max_top_logprobs_num": cfg.max_top_logprobs_num,
        "max_prompt_logprob_rows": cfg.max_prompt_logprob_rows,
        "api_key_set": cfg.api_key is not None,
        "admin_api_key_set": cfg.admin_api_key is not None,
    }
    return json_response(info)


def _capacity(state: WorkerState) -> int:
    """Tokens the KV cache holds: every slot, each of max_model_len tokens."""
    return state.runner.max_num_slots * state.max_model_len


async def handle_loads(request: web.Request) -> web.Response:
    """SGLang's `/v1/loads`: `?include=` sections (default all), `?dp_rank=` (only 0 here)."""
    state = _state(request)
    include = _sections(request.query.get("include"))
    rank = request.query.get("dp_rank")
    if rank not in (None, "0"):
        raise invalid("dp_rank", f"must be 0 (this worker is one data-parallel rank), got {rank!r}")
    fmt = request.query.get("format", "json")
    if fmt != "json":
        raise ApiError(
            "unsupported_parameter",
            f"format={fmt!r} is not supported; /metrics serves the Prometheus format",
            param="format",
        )
    load = await _load(state, include)
    return json_response(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": VERSION,
            "accelerator": state.runner_config.get("accelerator"),
            "num_accelerators": 1 if state.runner_config.get("accelerator") else 0,
            "loads": [load],
        }
    )


async def handle_get_load(request: web.Request) -> web.Response:
    """SGLang's older `/get_load`: one entry per data-parallel rank, in its field names."""
    load = await _load(_state(request), {"core"})
    total, used = load["num_total_tokens"], load["num_used_tokens"]
    entry = {
        "dp_rank": 0,
        "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
        "num_waiting_reqs": load["num_waiting_reqs"],
        "num_tokens": total,
        "num_pending_tokens": total - used,
        "ts_tic": time.perf_counter(),
    }
    return json_response([entry])


def _sections(raw: str | None) -> set[str]:
    if raw is None or not raw.strip():
        return {"all"}
    sections = {s.strip() for s in raw.split(",")}
    unknown = sections - LOAD_SECTIONS
    if unknown:
        raise invalid(
            "include", f"holds unknown sections {sorted(unknown)}; known: {sorted(LOAD_SECTIONS)}"
        )
    return sections


async def _load(state: WorkerState, include: set[str]) -> dict[str, Any]:
    snap: dict[str, int] = await on_engine(state, lambda: _snapshot(state.engine))
    every = "all" in include
    capacity = _capacity(state)
    load: dict[str, Any] = {"dp_rank": 0, "timestamp": time.time()}
    if every or "core" in include:
        load |= {
            "num_running_reqs": snap["running"],
            "num_waiting_reqs": snap["waiting"],
            "num_used_tokens": snap["used"],
            "num_total_tokens": snap["used"] + snap["pending"],
            "max_total_num_tokens": capacity,
            "token_usage": round(snap["used"] / capacity, 4) if capacity else 0.0,
            "max_running_requests": state.engine.scheduler.max_num_seqs,
        }
    if every or "memory" in include:
        load["memory"] = {
            "token_capacity": capacity,
            "kv_slots": state.runner.max_num_slots,
            "kv_slots_used": snap["running"],
            "slot_tokens": state.max_model_len,
        }
    if every or "queues" in include:
        load["queues"] = {
            "waiting": snap["waiting"],
            "paused": snap["paused"],
            "retracted": snap["retracted"],
        }
    return load


def _snapshot(engine: Engine) -> dict[str, int]:
    """Engine thread: sequence and token counts of the scheduler at this moment."""
    sched = engine.scheduler
    used = sum(
        s.num_prefilled if s.is_prefilling else s.num_prompt_tokens + s.num_output_tokens
        for s in sched.running
    )
    pending = sum(len(s.prefill_ids) - s.num_prefilled for s in sched.waiting)
    held = engine.paused is not None or bool(engine.held)
    return {
        "running": sched.num_running,
        "waiting": sched.num_waiting,
        "used": used,
        "pending": pending,
        "paused": sched.num_running + sched.num_waiting if held else 0,
        "retracted": sum(1 for s in sched.waiting if s.recompute_ids is not None),
    }

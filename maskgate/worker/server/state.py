"""What every handler needs, under one typed app key, and the admission of a request body:
size/JSON check, the worker's role, and the mask policy shared with the gateway."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from maskgate.protocol.errors import ApiError
from maskgate.protocol.policy import (
    PolicyConfig,
    Route,
    check_mask_request,
    is_mask_request,
    parse_body,
)
from maskgate.protocol.policy_settings import policy_from
from maskgate.worker.config import WorkerConfig
from maskgate.worker.engine.batch import Runner
from maskgate.worker.engine.engine import Engine
from maskgate.worker.metrics import WorkerMetrics
from maskgate.worker.server.inflight import InFlight
from maskgate.worker.server.output import Tokenizer


@dataclass(slots=True)
class WorkerState:
    config: WorkerConfig
    engine: Engine
    runner: Runner
    tokenizer: Tokenizer
    model_name: str
    metrics: WorkerMetrics
    policy: PolicyConfig
    sync: Any = None  # maskgate.worker.rl.weight_sync.WeightSync (torch; built at startup)
    runner_config: dict[str, Any] = field(default_factory=dict)  # model_type, architectures
    update_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one weight change at once
    rids: InFlight = field(default_factory=InFlight)  # request ids in flight

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.runner.max_model_len


class StateRef:
    """Filled at startup, once the model is loaded (the app is frozen by then, so the key
    holds this mutable reference rather than the state itself)."""

    def __init__(self) -> None:
        self.state: WorkerState | None = None

    def get(self) -> WorkerState:
        if self.state is None:
            raise ApiError("worker_unavailable", "the worker is starting", status=503)
        return self.state


STATE = web.AppKey("state", StateRef)


def policy_config(config: WorkerConfig) -> PolicyConfig:
    return policy_from(config)


async def admit(request: web.Request, route: Route) -> tuple[WorkerState, dict[str, Any], bool]:
    """The request's body, validated for this worker's role; mask requests pass the same
    policy rules (1, 3-9) as at the gateway, with the same status codes."""
    state = request.app[STATE].get()
    if not state.engine.alive:
        raise ApiError(
            "worker_unavailable", "the engine is not running", status=503, error_type="server_error"
        )
    body = parse_body(await request.read(), state.config.max_body_bytes)
    masked = is_mask_request(route, body)
    role = state.config.role
    if masked and role == "general":
        raise ApiError(
            "sampling_mask_not_served",
            "this worker runs in the general role and does not serve return_sampling_mask; "
            "send mask requests to a mask-pool worker (role mask or mixed)",
            param="return_sampling_mask",
        )
    if not masked and role == "mask":
        raise ApiError(
            "sampling_mask_required",
            "this worker runs in the mask role and serves only requests with "
            "return_sampling_mask=true; send other requests to the general pool",
            param="return_sampling_mask",
        )
    if masked:
        body = check_mask_request(route, body, state.policy, vocab_size=state.vocab_size)
    return state, body, masked


def check_prompt(ids: list[int], state: WorkerState, param: str) -> list[int]:
    if not ids:
        raise ApiError("invalid_parameter", f"{param} is empty", param=param)
    limit = state.max_model_len
    if len(ids) >= limit:
        raise ApiError(
            "context_length_exceeded",
            f"{param} has {len(ids)} tokens; this worker's max_model_len is {limit} "
            "(prompt + output), so the prompt must be shorter than that",
            param=param,
        )
    vocab = state.vocab_size
    if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < vocab for i in ids):
        raise ApiError(
            "invalid_parameter", f"{param} must hold token ids in [0, {vocab})", param=param
        )
    return ids


def request_id(request: web.Request) -> str:
    """The gateway's `x-request-id` when there is one (so logs and responses line up across
    the hop), else a fresh id."""
    rid = request.headers.get("x-request-id", "")
    return rid if 0 < len(rid) <= 128 and rid.isprintable() else uuid.uuid4().hex

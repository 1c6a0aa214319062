"""`create_app(config)`: the worker's aiohttp application, used by the CLI and every test.

The model loads and the engine thread starts in `cleanup_ctx`, so the server listens only
once it can answer; handlers reach everything through `app[STATE]`. Routes come from the one
table of routes.py, each behind its key check. One middleware renders every error as the
OpenAI-style body of `gateway.errors.ApiError`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from maskgate.protocol.errors import ApiError
from maskgate.protocol.responses import error_response
from maskgate.worker.config import WorkerConfig
from maskgate.worker.engine.engine import Engine, freeze_heap
from maskgate.worker.engine.scheduler import Scheduler
from maskgate.worker.metrics import WorkerMetrics
from maskgate.worker.server import routes
from maskgate.worker.server.auth import Keys
from maskgate.worker.server.backend import Backend, load_backend
from maskgate.worker.server.output import ClientGone
from maskgate.worker.server.state import STATE, StateRef, WorkerState, policy_config

log = logging.getLogger("maskgate.worker")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(config: WorkerConfig, *, backend: Backend | None = None) -> web.Application:
    """`backend`: an already loaded model + runner (tests share one); None loads
    `config.model` at startup, off the event loop."""
    app = web.Application(middlewares=[error_middleware], client_max_size=config.max_body_bytes)
    app[STATE] = StateRef()
    app.cleanup_ctx.append(_engine_ctx(config, backend))
    routes.register(app, Keys.of(config.api_key, config.admin_api_key))
    return app


def _engine_ctx(
    config: WorkerConfig, backend: Backend | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        loaded = backend
        if loaded is None:
            t0 = time.monotonic()
            loaded = await asyncio.get_running_loop().run_in_executor(None, load_backend, config)
            log.info("model %s ready in %.1f s", loaded.model_name, time.monotonic() - t0)
        metrics = WorkerMetrics()
        tok = loaded.tokenizer
        scheduler = Scheduler(
            loaded.runner,
            max_num_seqs=config.max_num_seqs,
            max_prefill_tokens=config.max_prefill_tokens,
            max_mask_tokens=config.max_mask_tokens,
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
            prefix_cache=not config.disable_radix_cache,
        )
        engine = Engine(
            loaded.runner, scheduler, metrics, overlap=not config.disable_overlap_schedule
        )
        engine.weight_version = config.weight_version
        sync = _weight_sync(loaded, engine, config)
        if backend is None:  # this process loaded the model: its heap is now the server's
            freeze_heap()
        engine.start()
        app[STATE].state = WorkerState(
            config=config,
            engine=engine,
            runner=loaded.runner,
            tokenizer=tok,
            model_name=config.served_model_name or loaded.model_name,
            metrics=metrics,
            policy=policy_config(config),
            sync=sync,
            runner_config=_model_facts(loaded),
        )
        try:
            yield
        finally:
            await engine.stop()
            gc.unfreeze()  # so exit can finalise those objects (extensions report leaks)

    return ctx


def _weight_sync(loaded: Backend, engine: Engine, config: WorkerConfig) -> object:
    from maskgate.worker.rl.weight_sync import WeightSync  # torch: only once a model runs

    return WeightSync(loaded.runner, engine, config.weight_update_timeout_s)  # type: ignore[arg-type]


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _model_facts(loaded: Backend) -> dict[str, object]:
    model_type = getattr(getattr(loaded.runner, "config", None), "model_type", None)
    arch = _ARCHITECTURES.get(model_type or "")
    device = getattr(loaded.runner, "device", None)
    return {
        "model_type": model_type,
        "architectures": [arch] if arch else None,
        "device": str(device) if device is not None else None,
        "accelerator": _accelerator(device),
    }


def _accelerator(device: Any) -> str | None:
    """The GPU's name (`/v1/loads`); None on the CPU."""
    if getattr(device, "type", None) != "cuda":
        return None
    import torch  # a CUDA runner is loaded: torch is already imported

    return str(torch.cuda.get_device_name(device))


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e)
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(ApiError("body_too_large", e.text or "body too large", status=413))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
        return error_response(
            ApiError(code, f"{request.method} {request.path}: {e.reason}", status=e.status)
        )
    except ClientGone:
        return web.Response(status=499)  # nobody is left to read it
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(
            ApiError("worker_error", "internal error", status=500, error_type="server_error")
        )

"""`maskgate worker ...`: flags become the last layer of the worker's one configuration path
(YAML file < MASKGATE_WORKER_* environment < flags)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from maskgate.protocol.policy_settings import MAX_MASK_TOKENS
from maskgate.protocol.settings import ConfigError

log = logging.getLogger("maskgate.worker")


def build_worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maskgate worker",
        description="Serve a model with sampling masks (SGLang /generate and OpenAI API).",
        argument_default=argparse.SUPPRESS,  # an absent flag leaves the config value alone
    )
    p.add_argument("--config", metavar="FILE", help="YAML config file (keys as below)")
    p.add_argument("--model", help="HF directory, .gguf file, tiny-random or smollm2")
    p.add_argument("--served-model-name", metavar="NAME", help="name in /v1/models")
    p.add_argument("--role", choices=["mask", "general", "mixed"], help="default mixed")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 30000)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default auto")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument(
        "--max-mask-tokens", type=int, metavar="N", help=f"mask cap C (default {MAX_MASK_TOKENS})"
    )
    p.add_argument("--max-num-seqs", type=int, metavar="N", help="running sequences (64)")
    p.add_argument("--max-model-len", type=int, metavar="N", help="tokens per sequence")
    p.add_argument("--kv-memory-gb", type=float, metavar="GB", help="KV cache budget")
    p.add_argument("--max-prefill-tokens", type=int, metavar="N", help="prefill chunk (2048)")
    p.add_argument("--disable-radix-cache", action="store_true", help="no prefix cache")
    p.add_argument(
        "--disable-overlap-schedule", action="store_true", help="one engine step at a time"
    )
    p.add_argument("--no-cuda-graphs", action="store_true", help="eager decode on CUDA")
    p.add_argument(
        "--no-fused-kernels", action="store_true", help="torch layers instead of Triton on CUDA"
    )
    p.add_argument("--mask-impl", choices=["kernel", "sort_all_rows"], help="default kernel")
    p.add_argument("--cpu-threads", type=int, metavar="N", help="torch threads (all cores)")
    p.add_argument("--weight-version", metavar="V", help="initial weight_version (default)")
    p.add_argument(
        "--weight-update-timeout-s", type=float, metavar="S", help="weight-group waits (300)"
    )
    p.add_argument(
        "--api-key", metavar="KEY", help="key for inference routes (env MASKGATE_WORKER_API_KEY)"
    )
    p.add_argument(
        "--admin-api-key",
        metavar="KEY",
        help="key for control routes (env MASKGATE_WORKER_ADMIN_API_KEY)",
    )
    p.add_argument("--shutdown-grace-s", type=float, metavar="S", help="drain time (60)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--check-config", action="store_true", help="print the config and exit")
    p.add_argument(
        "--warm-up-only",
        action="store_true",
        help="load the model and compile every kernel variant (into TRITON_CACHE_DIR), then "
        "exit without serving: fills a kernel cache for later workers",
    )
    return p


def worker_overrides(args: argparse.Namespace) -> dict[str, Any]:
    actions = ("config", "check_config", "warm_up_only")
    out = {k: v for k, v in vars(args).items() if k not in actions}
    if out.pop("no_cuda_graphs", False):
        out["cuda_graphs"] = False
    if out.pop("no_fused_kernels", False):
        out["fused_kernels"] = False
    return out


def main(argv: Sequence[str]) -> int:
    from maskgate.worker.config import load_config

    args = build_worker_parser().parse_args(list(argv))
    try:
        config = load_config(file=getattr(args, "config", None), overrides=worker_overrides(args))
    except ConfigError as e:
        print(f"maskgate worker: {e}", file=sys.stderr)
        return 2
    if getattr(args, "check_config", False):
        print(config.model_dump_json(indent=2))
        return 0
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if getattr(args, "warm_up_only", False):
        return _warm_up(config)
    try:
        asyncio.run(_serve(config))
    except Exception as e:  # a start-up failure: say what, not a traceback wall
        log.error("worker failed: %s", e, exc_info=config.log_level == "debug")
        return 1
    # Everything is closed by now. Interpreter teardown with torch's allocations takes
    # seconds (up to 10 s measured on a busy 2-core box) and would stretch every restart.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _warm_up(config: Any) -> int:
    """What a worker does before it serves (load the model, build the runner, which on CUDA
    compiles every sampler and model-kernel variant into Triton's cache), then exit: a job
    that runs this with the pool's settings fills a cache that later workers start from
    (docs/deploy.md, "Kernel cache")."""
    import time

    from maskgate.worker.server.backend import load_backend

    t0 = time.monotonic()
    try:
        backend = load_backend(config)
    except Exception as e:
        log.error("warm-up failed: %s", e, exc_info=config.log_level == "debug")
        return 1
    cache = os.environ.get("TRITON_CACHE_DIR", "Triton's default cache directory")
    log.info(
        "warm-up done in %.1f s on %s (kernel cache: %s); exiting without serving",
        time.monotonic() - t0,
        getattr(backend.runner, "device", config.device),
        cache,
    )
    return 0


async def _serve(config: Any) -> None:
    from aiohttp import web

    from maskgate.worker.server import create_app

    runner = web.AppRunner(
        create_app(config),
        handler_cancellation=True,  # a client that goes away aborts its request at once
        access_log=None,
        shutdown_timeout=config.shutdown_grace_s,
    )
    await runner.setup()  # loads the model and starts the engine
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else config.port
    log.info("worker ready on http://%s:%d (role %s)", config.host, port, config.role)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: finishing in-flight requests")
    await runner.cleanup()
    log.info("stopped")

"""`--workers N` (or `auto`, one per CPU: cores.py): N gateway processes sharing one port
through SO_REUSEPORT.

The kernel spreads new connections over the processes. The parent only supervises: it
restarts a child that dies (unless they die too fast, which means a bug or a bad host),
and forwards SIGTERM/SIGINT so every child drains on its own (see serve.py).
Each child has its own pools and metrics; child 0 is the control leader, which answers the
control, registration and admin API for all of them and publishes the control state the
others copy (leader.py), through unix sockets in a private directory made here.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from maskgate.gateway.cluster.leader import Cluster
from maskgate.gateway.config import GatewayConfig
from maskgate.gateway.observability.logs import configure_logging

LOG = logging.getLogger("maskgate.supervisor")
_MAX_RESTARTS = 5  # within _RESTART_WINDOW_S; more means something is badly wrong
_RESTART_WINDOW_S = 60.0


def _child(config: GatewayConfig, cluster: Cluster) -> None:
    from maskgate.gateway.processes.serve import run

    configure_logging(config.log_level, config.access_log)
    run(config, reuse_port=True, cluster=cluster)


def run_workers(config: GatewayConfig, processes: int) -> int:
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited loop state

    directory = tempfile.mkdtemp(prefix="maskgate-")  # 0700: only this user reaches the sockets
    try:
        return _supervise(config, ctx, directory, processes)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _supervise(config: GatewayConfig, ctx: Any, directory: str, processes: int) -> int:
    def start(index: int) -> BaseProcess:
        # `processes` is `workers` with `auto` resolved: the leader's barrier waits for
        # processes - 1 followers, so it must be the number actually started here.
        cluster = Cluster(directory, index, processes)
        proc = ctx.Process(
            target=_child, args=(config, cluster), name=f"maskgate-gateway-{index}", daemon=False
        )
        proc.start()
        return proc

    procs = [start(i) for i in range(processes)]
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    LOG.info("started workers", extra={"workers": processes, "pids": [p.pid for p in procs]})

    restarts: list[float] = []
    failed = False
    while not stopping:
        time.sleep(0.2)
        for i, proc in enumerate(procs):
            if proc.is_alive() or stopping:
                continue
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < _RESTART_WINDOW_S] + [now]
            LOG.error("worker exited", extra={"pid": proc.pid, "exitcode": proc.exitcode})
            if len(restarts) > _MAX_RESTARTS:
                LOG.error("workers keep dying; stopping")
                failed = True
                on_signal(signal.SIGTERM, None)
                break
            procs[i] = start(i)

    deadline = time.monotonic() + config.shutdown_delay_s + config.shutdown_grace_s + 10.0
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
    codes = [proc.exitcode for proc in procs]
    return 1 if failed or any(code not in (0, -signal.SIGTERM) for code in codes) else 0

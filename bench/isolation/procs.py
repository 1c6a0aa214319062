"""Starting, probing and stopping the workers and the gateway of one layout."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.child import free_port, log_tail, stop, wait_ok

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    """A child process (worker or gateway) listening on 127.0.0.1:port, logging to a file."""

    name: str
    argv: list[str]
    port: int
    ready_path: str  # GET path answering 200 once it serves
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".log")[1]))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Proc:
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def wait_ready(self, deadline: float) -> None:
        """Poll ready_path until 200; exit with the log's tail when it dies or times out."""
        assert self.proc is not None
        wait_ok(
            self.name, self.proc, self.url + self.ready_path, deadline, self.log, interval_s=0.2
        )

    def tail(self, chars: int = 3000) -> str:
        return log_tail(self.log, chars)

    def stop(self, timeout_s: float = 15) -> None:
        stop(self.proc, timeout_s, group=False)


def worker(
    name: str,
    *,
    model: str,
    role: str,
    device: str,
    mask_impl: str,
    kv_memory_gb: float,
    max_model_len: int,
    max_num_seqs: int,
    cpu_threads: int | None,
    gpu: int | None = None,
) -> Proc:
    """A worker process; `gpu` pins it to that card alone (CUDA_VISIBLE_DEVICES)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "maskgate.cli", "worker",
        "--model", model,
        "--role", role,
        "--device", device,
        "--mask-impl", mask_impl,
        "--port", str(port),
        "--kv-memory-gb", str(kv_memory_gb),
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--shutdown-grace-s", "2",
        "--log-level", "warning",
    ]  # fmt: skip
    if cpu_threads is not None:
        argv += ["--cpu-threads", str(cpu_threads)]
    env = {} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)}
    return Proc(name, argv, port, "/health", env)


def gateway(general: list[str], mask: list[str], processes: int) -> Proc:
    """The gateway in front of the given pools (each a list of worker URLs; a URL may
    serve both pools, as a `mixed` worker does)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "maskgate.gateway",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", str(processes),
        *(a for url in general for a in ("--general-endpoint", url)),
        *(a for url in mask for a in ("--mask-endpoint", url)),
        "--no-access-log",
        "--log-level", "warning",
    ]  # fmt: skip
    return Proc("gateway", argv, port, "/readyz")

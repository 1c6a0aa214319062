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
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".log")[1]))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Proc:
        env = dict(os.environ)
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
) -> Proc:
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
    return Proc(name, argv, port, "/health")


def gateway(general: str, mask: str, processes: int) -> Proc:
    port = free_port()
    argv = [
        sys.executable, "-m", "maskgate.gateway",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", str(processes),
        "--general-endpoint", general,
        "--mask-endpoint", mask,
        "--no-access-log",
        "--log-level", "warning",
    ]  # fmt: skip
    return Proc("gateway", argv, port, "/readyz")

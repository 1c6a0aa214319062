"""Worker and gateway processes for the real-client tests: `python -m maskgate.cli ...`
children on loopback, each logged to a file, stopped together."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_env import REPO, child_env, free_port
from rl_clients import POLL_S, status_is_200

WORKER_ARGS = ["--model", "tiny-random", "--device", "cpu", "--max-model-len", "2048",
               "--max-num-seqs", "4", "--cpu-threads", "1", "--weight-version", "0"]  # fmt: skip


class Processes:
    """`python -m maskgate.cli ...` children on loopback, logged under `log_dir`, stopped
    together (SIGTERM, then SIGKILL after 15 s)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, args: list[str]) -> None:
        log = self.log_dir / f"{name}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "maskgate.cli", *args],
            cwd=REPO, env=child_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append((proc, log))

    def worker(self, name: str) -> str:
        port = free_port()
        self.start(name, ["worker", *WORKER_ARGS, "--host", "127.0.0.1", "--port", str(port)])
        return f"http://127.0.0.1:{port}"

    def wait(self, url: str, path: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while not status_is_200("GET", url + path):
            for proc, log in self.procs:
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"{url}{path} not 200 after {timeout_s} s"
            time.sleep(POLL_S)

    def stop(self) -> None:
        for proc, _ in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
        for proc, _ in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

"""Starting, pinning, probing and stopping the processes a bench run needs.

Every process is started under `taskset -c CPUS` (children inherit the mask), so wrk,
nginx and the proxy under test share this machine's cores the same way in every set-up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
PROBE_BODY = b'{"model":"bench-model","messages":[{"role":"user","content":"ping"}]}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def taskset(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus]


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    """Poll POST {url}/v1/chat/completions until it answers 200 (the proxy reached nginx)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        req = urllib.request.Request(
            url + "/v1/chat/completions",
            data=PROBE_BODY,
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except OSError as e:
            last = str(e)
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready after {timeout_s} s ({last}):\n{log.read_text()[-3000:]}")


@dataclass
class Proxy:
    """A proxy under test (the maskgate gateway or sglang-router) in front of `upstream`."""

    name: str
    argv: list[str]
    cpus: str
    port: int
    cwd: Path = REPO
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".log")[1]))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 60) -> Proxy:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*taskset(self.cpus), *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                # Its own process group, so stop() reaches the workers too, but the bench's
                # session: a new session would get its own scheduler autogroup at nice 0.
                process_group=0,
            )
        wait_ready(self.url, self.proc, ready_timeout_s, self.log)
        return self

    def processes(self) -> list[psutil.Process]:
        """The proxy's process tree (master + workers), for RSS and CPU accounting."""
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def gateway(upstream: str, cpus: str, workers: int, access_log: bool, root: Path = REPO) -> Proxy:
    """`python -m gateway` run from `root` (a checkout: compare two versions of the gateway)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "gateway",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--general-endpoint", upstream,
        "--mask-endpoint", upstream,
        "--workers", str(workers),
        *([] if access_log else ["--no-access-log"]),
    ]  # fmt: skip
    return Proxy(f"gateway-w{workers}", argv, cpus, port, cwd=root)


def floor(upstream: str, cpus: str, mode: str) -> Proxy:
    """A bare aiohttp process (bench/gateway/floor.py): the floor under the gateway."""
    port = free_port()
    argv = [
        sys.executable, str(Path(__file__).with_name("floor.py")),
        "--mode", mode,
        "--port", str(port),
        "--upstream", upstream,
    ]  # fmt: skip
    return Proxy(f"aiohttp-{mode}", argv, cpus, port)


def router(upstream: str, cpus: str, access_log: bool) -> Proxy:
    port = free_port()
    argv = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", upstream,
        "--policy", "round_robin",
        "--log-level", "info" if access_log else "warn",
    ]  # fmt: skip
    return Proxy("sglang-router", argv, cpus, port)

"""Starting, pinning, probing and stopping the processes a bench run needs.

Every process is started under `taskset -c CPUS` (children inherit the mask), so wrk,
nginx and the proxy under test share this machine's cores the same way in every set-up.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.child import free_port, stop, wait_ok

REPO = Path(__file__).resolve().parents[2]
PROBE_BODY = b'{"model":"bench-model","messages":[{"role":"user","content":"ping"}]}'


def taskset(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus]


def probe(url: str) -> urllib.request.Request:
    """POST {url}/v1/chat/completions: it answers 200 once the proxy reaches nginx."""
    return urllib.request.Request(
        url + "/v1/chat/completions",
        data=PROBE_BODY,
        headers={"content-type": "application/json"},
    )


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
        deadline = time.monotonic() + ready_timeout_s
        wait_ok(self.name, self.proc, probe(self.url), deadline, self.log, interval_s=0.1)
        return self

    def processes(self) -> list[psutil.Process]:
        """The proxy's process tree (master + workers), for RSS and CPU accounting."""
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def stop(self) -> None:
        stop(self.proc, 15, group=True)


def gateway(
    upstream: str, cpus: str, workers: int | None, access_log: bool, root: Path = REPO
) -> Proxy:
    """`python -m maskgate.gateway` run from `root` (a checkout: compare two versions of the
    gateway). `workers` None: the default (`auto`, one process per CPU it may use)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "maskgate.gateway",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--general-endpoint", upstream,
        "--mask-endpoint", upstream,
        *([] if workers is None else ["--workers", str(workers)]),
        *([] if access_log else ["--no-access-log"]),
    ]  # fmt: skip
    return Proxy(
        f"gateway-{'auto' if workers is None else f'w{workers}'}", argv, cpus, port, cwd=root
    )


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

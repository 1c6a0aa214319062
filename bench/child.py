"""A benchmark's child server process: a port to listen on, the wait until it serves, the stop.

Shared by bench/gateway/procs.py and bench/isolation/procs.py, which start their processes
differently (CPU pinning and process groups there, PYTHONPATH here) but probe and stop them
the same way.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:]


def wait_ok(
    name: str,
    proc: subprocess.Popen[bytes],
    request: urllib.request.Request | str,
    deadline: float,
    log: Path,
    interval_s: float,
) -> None:
    """Send `request` every `interval_s` until it answers 200; exit with the log's tail when
    the process dies or `deadline` (time.monotonic()) passes."""
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}:\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(request, timeout=2) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except OSError as e:
            last = str(e)
        time.sleep(interval_s)
    raise SystemExit(f"{name} not ready in time ({last}):\n{log_tail(log)}")


def stop(proc: subprocess.Popen[bytes] | None, timeout_s: float, *, group: bool) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`. group: signal the process group `proc` leads
    (started with process_group=0), which reaches its workers too."""
    if proc is None or proc.poll() is not None:
        return
    send = functools.partial(os.killpg, proc.pid) if group else proc.send_signal
    send(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()

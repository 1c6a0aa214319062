"""The machine a bench run ran on, and the priority it runs at."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from bench.gateway.procs import REPO


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
    except OSError:
        return "missing"
    text = (out.stdout + out.stderr).strip()
    return text.splitlines()[0] if text else "?"


def versions() -> dict[str, str]:
    """Versions of everything in the measurement, the commit, and the CPU."""
    try:
        router = version("sglang-router")
    except PackageNotFoundError:
        router = "missing"
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "gateway"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "python": platform.python_version(),
        "nginx": _first_line(["nginx", "-v"]),
        "wrk": _first_line(["wrk", "-v"]),
        "sglang_router": router,
        "git_commit": _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        # Uncommitted gateway changes at the start (a shared working tree may have some).
        "gateway_dirty": " ".join(dirty.split()),
        "cpu": cpu,
        "cpus": str(os.cpu_count()),
    }


def set_priority(nice: int) -> int | None:
    """Renice the bench (inherited by all it starts) and, with scheduler autogroups on, its
    session's group: the kernel first shares CPU between sessions' groups and applies a
    process's nice only inside its group, so a process nice alone does nothing against other
    sessions' work. Returns the group's previous nice, to restore it; None if unchanged."""
    autogroup = Path("/proc/self/autogroup")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        if not autogroup.exists():
            return None
        before = int(autogroup.read_text().split()[-1])  # "/autogroup-9 nice 0"
        autogroup.write_text(str(nice))
        return before
    except (PermissionError, OSError) as e:
        print(f"cannot set niceness {nice} ({e}); numbers may be skewed by other work")
        return None

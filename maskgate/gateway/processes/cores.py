"""How many CPUs this process may use: `workers: auto` starts one gateway process per CPU.

Like nginx's `worker_processes auto`, but container-aware: a CPU quota set through cgroups
(`docker run --cpus`, a Kubernetes CPU limit) is what the processes can actually use, not
the host's core count, and more processes than that only add context switches. The answer
is the smallest of: the CPUs this process is allowed to run on (its affinity mask), and the
cgroup quota rounded up (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us / cpu.cfs_period_us`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maskgate.gateway.config import GatewayConfig

CGROUP_ROOT = Path("/sys/fs/cgroup")


def process_count(config: GatewayConfig) -> int:
    """How many gateway processes `workers` asks for, with `auto` resolved."""
    if config.workers != "auto":
        return config.workers
    if config.port == 0:
        return 1  # an ephemeral port cannot be shared
    return min(256, available_cpus())


def cgroup_quota(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
) -> float | None:
    """CPUs' worth of quota from the cgroup this process is in; None when there is none."""
    for path in _candidates(root, proc_cgroup):
        v2 = path / "cpu.max"  # "max 100000" or "<quota> <period>", microseconds
        if v2.is_file():
            quota, _, period = _read(v2).partition(" ")
            if quota != "max" and _positive(quota) and _positive(period):
                return int(quota) / int(period)
            continue
        v1_quota, v1_period = path / "cpu.cfs_quota_us", path / "cpu.cfs_period_us"
        if v1_quota.is_file() and v1_period.is_file():
            quota, period = _read(v1_quota), _read(v1_period)  # quota -1: no limit
            if _positive(quota) and _positive(period):
                return int(quota) / int(period)
    return None


def available_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_quota(root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota - 1e-9)))
    return max(1, cpus)


def _candidates(root: Path, proc_cgroup: Path) -> list[Path]:
    """The cgroup directories that may hold this process's CPU limit: its own (as named in
    /proc/self/cgroup, for both hierarchies), then the root (a container usually sees its
    own cgroup mounted there)."""
    out = []
    text = _read(proc_cgroup) if proc_cgroup.is_file() else ""
    for line in text.splitlines():
        _, controllers, rel = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "" or "cpu" in controllers.split(","):
            for base in (root, root / "cpu", root / "cpu,cpuacct"):
                out.append(base / rel.lstrip("/"))
    out += [root, root / "cpu", root / "cpu,cpuacct"]
    return list(dict.fromkeys(out))  # first occurrence of each, in order


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _positive(text: str) -> bool:
    return text.isascii() and text.isdigit() and int(text) > 0

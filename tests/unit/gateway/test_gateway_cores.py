"""`workers: auto`: the CPU count from the affinity mask and the cgroup quota, on fake
cgroup trees (v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from maskgate.gateway import GatewayConfig
from maskgate.gateway.processes.cores import available_cpus, cgroup_quota, process_count
from maskgate.protocol.settings import load_settings


def tree(tmp_path: Path, files: dict[str, str], proc: str = "0::/\n") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(exist_ok=True)
    proc_file = tmp_path / "proc_cgroup"
    proc_file.write_text(proc)
    return root, proc_file


@pytest.mark.parametrize(
    ("files", "proc", "quota"),
    [
        ({"cpu.max": "150000 100000\n"}, "0::/\n", 1.5),  # v2, container root
        ({"cpu.max": "max 100000\n"}, "0::/\n", None),  # v2, no limit
        ({"kubepods/pod1/cpu.max": "400000 100000\n"}, "0::/kubepods/pod1\n", 4.0),  # v2 leaf
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, "", 2.0),
        (
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
            },
            "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n",
            0.5,
        ),  # v1, named hierarchy
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "", None),  # v1 off
        ({"cpu.max": "garbage\n"}, "0::/\n", None),
        ({"cpu.max": "0x10 100000\n"}, "0::/\n", None),
        ({}, "", None),  # no cgroup files at all (not Linux, or not mounted)
    ],
)
def test_cgroup_quota(tmp_path: Path, files: dict[str, str], proc: str, quota: float | None):
    root, proc_file = tree(tmp_path, files, proc)
    assert cgroup_quota(root, proc_file) == quota


def test_available_cpus_is_the_smaller_of_affinity_and_quota(tmp_path: Path):
    affinity = len(os.sched_getaffinity(0))
    root, proc = tree(tmp_path, {"cpu.max": "max 100000"})
    assert available_cpus(root, proc) == affinity
    root, proc = tree(tmp_path / "a", {"cpu.max": "150000 100000"})
    assert available_cpus(root, proc) == min(affinity, 2)  # 1.5 CPUs: rounded up
    root, proc = tree(tmp_path / "b", {"cpu.max": "10000 100000"})
    assert available_cpus(root, proc) == 1  # a tenth of a CPU is still one process
    root, proc = tree(tmp_path / "c", {"cpu.max": f"{100000 * (affinity + 8)} 100000"})
    assert available_cpus(root, proc) == affinity  # a quota above the cores adds nothing


def test_workers_auto_is_the_default_and_an_integer_still_works(monkeypatch):
    monkeypatch.setattr("maskgate.gateway.processes.cores.available_cpus", lambda: 3)
    assert load_settings(GatewayConfig).workers == "auto"
    assert process_count(load_settings(GatewayConfig)) == 3
    assert process_count(load_settings(GatewayConfig, overrides={"port": 0})) == 1
    assert process_count(load_settings(GatewayConfig, overrides={"workers": 5})) == 5
    env = {"MASKGATE_WORKERS": "auto"}
    assert load_settings(GatewayConfig, env=env, env_prefix="MASKGATE_").workers == "auto"

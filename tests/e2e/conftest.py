"""Real processes: the gateway in front of a mask worker and a general worker, all running
`tiny-random` on the CPU, started once per session (`maskgate worker` / `maskgate gateway`,
through `python -m maskgate.cli` so no installed console script is needed).

Also the oracle for the log-prob checks: transformers' own Llama over the same weights
(written out by `save_tiny_random`), an implementation independent of the worker's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_env import REPO, child_env, free_port

MASK_CAP = 32  # the mask worker's max_mask_tokens: small, so overflows are easy to provoke
MAX_MODEL_LEN = 2048
START_TIMEOUT_S = 180.0


@dataclass
class Proc:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@dataclass(frozen=True)
class Cluster:
    gateway: str
    mask: str  # the mask worker, called directly
    general: str
    mask_cap: int = MASK_CAP
    max_model_len: int = MAX_MODEL_LEN


def _start(name: str, args: list[str], port: int, log_dir: Path) -> Proc:
    log = log_dir / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "maskgate.cli", *args, "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env=child_env(),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return Proc(name, f"http://127.0.0.1:{port}", proc, log)


def _wait(procs: list[Proc], path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    pending = list(procs)
    while pending:
        for p in list(pending):
            if p.proc.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.tail()}")
            try:
                with urllib.request.urlopen(p.url + path, timeout=1) as resp:
                    if resp.status == 200:
                        pending.remove(p)
            except (urllib.error.URLError, OSError):
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready after {START_TIMEOUT_S} s: {pending[0].tail()}")
        time.sleep(0.2)


def _stop(procs: list[Proc]) -> None:
    for p in procs:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.proc.wait(15)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    log_dir = tmp_path_factory.mktemp("e2e-logs")
    common = ["--model", "tiny-random", "--device", "cpu", "--max-model-len", str(MAX_MODEL_LEN)]
    common += ["--max-num-seqs", "8", "--max-mask-tokens", str(MASK_CAP), "--cpu-threads", "1"]
    procs = [
        _start("mask-worker", ["worker", *common, "--role", "mask"], free_port(), log_dir),
        _start("general-worker", ["worker", *common, "--role", "general"], free_port(), log_dir),
    ]
    try:
        _wait(procs, "/health")
        # The gateway starts once its upstreams answer, so its first health checks pass.
        gw_args = ["gateway", "--general-endpoint", procs[1].url, "--mask-endpoint", procs[0].url]
        gw_args += ["--max-mask-tokens", str(MASK_CAP), "--log-level", "warning"]
        # One process (not `auto`): the tests read /metrics, which is per process.
        gw_args += ["--workers", "1"]
        procs.append(_start("gateway", gw_args, free_port(), log_dir))
        _wait(procs[2:], "/readyz")
        yield Cluster(gateway=procs[2].url, mask=procs[0].url, general=procs[1].url)
    finally:
        _stop(list(reversed(procs)))


@pytest.fixture(scope="session")
def oracle(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """transformers' LlamaForCausalLM over the tiny-random weights, float32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from maskgate.worker.model import save_tiny_random

    path = save_tiny_random(tmp_path_factory.mktemp("tiny-random"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def smollm2_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A general worker serving SmolLM2-135M (float32, CPU); its URL. Slow: the first run
    downloads and converts the GGUF (cached after), so only with MASKGATE_SLOW=1."""
    if os.environ.get("MASKGATE_SLOW") != "1":
        pytest.skip("set MASKGATE_SLOW=1")
    from maskgate.worker.model.gguf_convert import cache_root

    log_dir = tmp_path_factory.mktemp("e2e-smollm2")
    # _start drops MASKGATE_* from the environment: the model cache goes in a config file.
    config = log_dir / "worker.yaml"
    config.write_text(f"cache_dir: {json.dumps(str(cache_root()))}\n")
    args = ["worker", "--config", str(config), "--model", "smollm2", "--device", "cpu"]
    args += ["--max-model-len", "512", "--max-num-seqs", "4", "--cpu-threads", "1"]
    proc = _start("smollm2-worker", args, free_port(), log_dir)
    try:
        _wait([proc], "/health")
        yield proc.url
    finally:
        _stop([proc])

"""Weight sync on CUDA, through a real worker process: a trainer process sends bfloat16 CUDA
tensors as CUDA IPC handles (/update_weights_from_tensor), a checkpoint loads from disk, and
memory is released and resumed (device memory really freed, CUDA graphs captured again). After
each step the greedy output must equal the worker's model run offline over the same weights."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from rl_trainer import offline_greedy, perturbed_weights, post, save_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpu_alone,  # reads the device's free memory (tests/gpu/conftest.py)
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

REPO = Path(__file__).resolve().parents[2]
PROMPT = [5, 17, 33, 101, 7]
N = 16


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Path]]:
    tmp = tmp_path_factory.mktemp("gpu-sync")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKGATE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    args = ["--model", "tiny-random", "--device", "cuda", "--max-model-len", "4096"]
    args += ["--max-num-seqs", "64", "--kv-memory-gb", "1", "--port", str(port)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "maskgate.cli", "worker", *args],
        cwd=REPO, env=env, stdout=(tmp / "worker.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    trainer = subprocess.Popen(
        [sys.executable, str(REPO / "tests/e2e/rl_trainer.py"), "serve", "--url", url],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert worker.poll() is None, (tmp / "worker.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert json.loads(trainer.stdout.readline()) == {"ready": True}  # type: ignore[union-attr]
        yield url, trainer, tmp
    finally:
        for p in (trainer, worker):
            p.send_signal(signal.SIGTERM)
            p.wait(30)


def greedy(url: str) -> list[int]:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"temperature": 0, "max_new_tokens": N, "ignore_eos": True},
    }
    status, out = post(url, "/generate", body)
    assert status == 200, out
    return out["output_ids"]


def test_cuda_ipc_disk_and_memory_release(procs: tuple[str, Any, Path]) -> None:
    url, trainer, tmp = procs
    assert greedy(url) == offline_greedy("tiny-random", PROMPT, N, "cuda")

    trainer.stdin.write(
        json.dumps({"op": "tensor", "seed": 3, "version": "ipc", "device": "cuda"}) + "\n"
    )
    trainer.stdin.flush()
    res = json.loads(trainer.stdout.readline())
    assert res["status"] == 200 and res["body"]["success"], res
    ckpt3 = str(save_checkpoint(tmp / "seed3", perturbed_weights(3)))
    expected = offline_greedy(ckpt3, PROMPT, N, "cuda")
    assert greedy(url) == expected

    ckpt2 = str(save_checkpoint(tmp / "seed2", perturbed_weights(2)))
    status, reply = post(
        url, "/update_weights_from_disk", {"model_path": ckpt2, "weight_version": "disk"}
    )
    assert status == 200 and reply["success"], reply
    expected = offline_greedy(ckpt2, PROMPT, N, "cuda")
    assert greedy(url) == expected

    free_before, _ = torch.cuda.mem_get_info()
    status, _ = post(url, "/release_memory_occupation", {})
    assert status == 200
    free_released, _ = torch.cuda.mem_get_info()
    # tiny-random's KV cache at 65 slots x 4096 tokens is 65 MiB; the weights add ~2 MiB.
    assert free_released - free_before > 50 * 2**20, (free_before, free_released)
    status, _ = post(url, "/resume_memory_occupation", {})
    assert status == 200
    assert greedy(url) == expected  # same weights, graphs captured again

"""A worker in the RL loop, through real processes: one tiny-random CPU worker, and trainer
processes (tests/e2e/rl_trainer.py) that push weights through a gloo group and through shared
memory. After each update the worker's greedy output must equal the worker's model run
offline over the same weights, and `weight_version` must follow. Also: pause in its three
modes with requests in flight, abort by rid, flush_cache while busy, refused updates that
leave the old weights serving, and trainers that die or stall mid-broadcast."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_trainer import offline_greedy, perturbed_weights, save_checkpoint

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PROMPT = [5, 17, 33, 101, 7]
N = 12
TIMEOUT_S = 5.0  # the worker's weight_update_timeout_s
GREEDY = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}
LONG = {"temperature": 0, "max_new_tokens": 1500, "ignore_eos": True}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKGATE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@dataclass
class RL:
    url: str
    tmp: Path
    trainer: subprocess.Popen[str]
    spec: str = "tiny-random"  # the weights the worker should be serving now
    refs: dict[str, list[int]] = field(default_factory=dict)

    def command(self, cmd: dict[str, Any]) -> Any:
        assert self.trainer.stdin is not None and self.trainer.stdout is not None
        self.trainer.stdin.write(json.dumps(cmd) + "\n")
        self.trainer.stdin.flush()
        return json.loads(self.trainer.stdout.readline())

    def checkpoint(self, seed: int) -> str:
        path = self.tmp / f"seed{seed}"
        if not path.exists():
            save_checkpoint(path, perturbed_weights(seed))
        return str(path)

    def expected(self) -> list[int]:
        if self.spec not in self.refs:
            self.refs[self.spec] = offline_greedy(self.spec, PROMPT, N)
        return self.refs[self.spec]


@pytest.fixture(scope="module")
def rl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RL]:
    tmp = tmp_path_factory.mktemp("rl")
    port = _port()
    args = ["--model", "tiny-random", "--device", "cpu", "--max-model-len", "2048"]
    args += ["--max-num-seqs", "8", "--cpu-threads", "1", "--weight-version", "v0"]
    args += ["--weight-update-timeout-s", str(TIMEOUT_S), "--host", "127.0.0.1"]
    log = (tmp / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "maskgate.cli", "worker", *args, "--port", str(port)],
        cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    trainer = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "rl_trainer.py"), "serve", "--url", url],
        cwd=REPO, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            assert worker.poll() is None, (tmp / "worker.log").read_text()[-3000:]
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "worker did not start"
                time.sleep(0.3)
        assert trainer.stdout is not None
        assert json.loads(trainer.stdout.readline()) == {"ready": True}
        yield RL(url, tmp, trainer)
    finally:
        for p in (trainer, worker):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


async def call(url: str, path: str, body: Any = None, method: str = "POST") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url + path, json=body) as r:
        raw = await r.read()
        try:
            return r.status, orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return r.status, raw.decode()


async def generate(rl: RL, params: dict[str, Any] = GREEDY, **extra: Any) -> dict[str, Any]:
    status, body = await call(
        rl.url, "/generate", {"input_ids": PROMPT, "sampling_params": params, **extra}
    )
    assert status == 200, body
    return body


async def check_serving(rl: RL, version: str) -> None:
    out = await generate(rl)
    assert out["output_ids"] == rl.expected()
    assert out["meta_info"]["weight_version"] == version
    assert out["meta_info"]["weight_versions"] == [{"version": version, "start": 0, "end": N}]
    status, info = await call(rl.url, "/model_info", method="GET")
    assert status == 200 and info["weight_version"] == version
    status, got = await call(rl.url, "/get_weight_version", method="GET")
    assert got == {"weight_version": version}


async def test_initial_weights_and_version(rl: RL) -> None:
    await check_serving(rl, "v0")


async def test_update_from_distributed(rl: RL) -> None:
    init = rl.command({"op": "init", "port": _port()})
    assert init[0] == 200 and init[1]["success"], init
    res = rl.command({"op": "distributed", "seed": 1, "version": "v1"})
    assert res["status"] == 200 and res["body"]["success"], res
    assert res["body"]["message"].endswith("Weight version updated to v1.")
    rl.spec = rl.checkpoint(1)
    await check_serving(rl, "v1")
    status, reply = await call(
        rl.url, "/destroy_weights_update_group", {"group_name": "rl-test-group"}
    )
    assert status == 200 and reply["success"], reply


async def test_update_from_disk(rl: RL) -> None:
    body = {"model_path": rl.checkpoint(2), "weight_version": "v2", "unknown_field": 1}
    status, reply = await call(rl.url, "/update_weights_from_disk", body)
    assert status == 200 and reply["success"] and reply["num_paused_requests"] == 0, reply
    rl.spec = rl.checkpoint(2)
    await check_serving(rl, "v2")


async def test_update_from_shared_memory_tensors(rl: RL) -> None:
    res = rl.command({"op": "tensor", "seed": 3, "version": "v3"})
    assert res["status"] == 200 and res["body"]["success"], res
    rl.spec = rl.checkpoint(3)
    await check_serving(rl, "v3")


@pytest.mark.parametrize(
    "override",
    [
        {"names": "model.layers.7.self_attn.q_proj.weight"},
        {"dtypes": "int32"},
        {"shapes": [3, 3]},
    ],
)
async def test_bad_distributed_update_is_refused(rl: RL, override: dict[str, Any]) -> None:
    init = rl.command({"op": "init", "port": _port()})
    assert init[0] == 200, init
    res = rl.command({"op": "distributed", "seed": 4, "version": "bad", "override": override})
    assert res["status"] == 400 and res["body"]["success"] is False, res
    assert not res["broadcast_completed"]  # the worker left the group: the trainer sees it
    await check_serving(rl, "v3")
    # The failed update destroyed the group on the worker.
    status, _ = await call(rl.url, "/destroy_weights_update_group", {"group_name": "rl-test-group"})
    assert status == 400


async def test_bad_checkpoints_are_refused(rl: RL) -> None:
    import json as _json

    wrong = Path(rl.checkpoint(5))
    cfg = _json.loads((wrong / "config.json").read_text())
    cfg["hidden_size"] = 128
    (wrong / "config.json").write_text(_json.dumps(cfg))
    status, reply = await call(rl.url, "/update_weights_from_disk", {"model_path": str(wrong)})
    assert status == 400 and reply["success"] is False
    assert "hidden_size=128" in reply["message"], reply
    status, reply = await call(rl.url, "/update_weights_from_disk", {"model_path": str(rl.tmp)})
    assert status == 400 and "config.json" in reply["message"]
    status, reply = await call(
        rl.url, "/update_weights_from_disk", {"model_path": rl.checkpoint(2), "load_format": "gguf"}
    )
    assert status == 400 and reply["error"]["code"] == "unsupported_parameter"
    await check_serving(rl, "v3")


def _halting_trainer(rl: RL, mode: str) -> subprocess.Popen[str]:
    script = str(Path(__file__).parent / "rl_trainer.py")
    return subprocess.Popen(
        [sys.executable, script, mode, "--url", rl.url, "--port", str(_port())],
        cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["die", "stall"])
async def test_trainer_halting_mid_broadcast_does_not_hang(rl: RL, mode: str) -> None:
    proc = _halting_trainer(rl, mode)
    try:
        assert proc.stdout is not None
        init = json.loads(proc.stdout.readline())["init"]
        assert init[0] == 200, init
        assert json.loads(proc.stdout.readline()) == {"halted": mode}
        t0 = time.monotonic()
        await asyncio.sleep(1)  # the trainer's update call, sent before the broadcast, is in
        # Meanwhile the update call waits in the worker; generation still answers.
        await check_serving(rl, "v3")
        status, _ = await call(rl.url, "/health", method="GET")
        assert status == 200
        if mode == "die":
            assert proc.wait(10) == 3
        # The update call (the trainer's) fails within the timeout and destroys the group;
        # a destroy queues behind it (one weight change at a time), then finds nothing.
        status, reply = await call(
            rl.url, "/destroy_weights_update_group", {"group_name": "rl-test-group"}
        )
        assert status == 400, reply
        assert time.monotonic() - t0 < TIMEOUT_S + 5
        await check_serving(rl, "v3")
    finally:
        proc.kill()
        proc.wait()

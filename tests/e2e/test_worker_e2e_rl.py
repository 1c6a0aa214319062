"""A worker in the RL loop, through real processes: one tiny-random CPU worker, and trainer
processes (tests/e2e/rl_trainer.py) that push weights through a gloo group and through shared
memory. After each update the worker's greedy output must equal the worker's model run
offline over the same weights, and `weight_version` must follow. Also: pause in its three
modes with requests in flight, abort by rid, flush_cache while busy, refused updates that
leave the old weights serving, and trainers that die or stall mid-broadcast."""

from __future__ import annotations

import asyncio
import json
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
from child_env import REPO, child_env, free_port
from rl_trainer import offline_greedy, perturbed_weights, save_checkpoint

pytestmark = pytest.mark.e2e

PROMPT = [5, 17, 33, 101, 7]
N = 12
TIMEOUT_S = 5.0  # the worker's weight_update_timeout_s
GREEDY = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}
LONG = {"temperature": 0, "max_new_tokens": 1500, "ignore_eos": True}


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
    port = free_port()
    args = ["--model", "tiny-random", "--device", "cpu", "--max-model-len", "2048"]
    args += ["--max-num-seqs", "8", "--cpu-threads", "1", "--weight-version", "v0"]
    args += ["--weight-update-timeout-s", str(TIMEOUT_S), "--host", "127.0.0.1"]
    log = (tmp / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "maskgate.cli", "worker", *args, "--port", str(port)],
        cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    trainer = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "rl_trainer.py"), "serve", "--url", url],
        cwd=REPO, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
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
    init = rl.command({"op": "init", "port": free_port()})
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


async def test_update_from_a_safetensors_payload(rl: RL) -> None:
    res = rl.command({"op": "tensor", "seed": 4, "version": "v4"})
    assert res["status"] == 200 and res["body"]["success"], res
    rl.spec = rl.checkpoint(4)
    await check_serving(rl, "v4")


async def test_update_from_shared_memory_tensors(rl: RL) -> None:
    res = rl.command({"op": "tensor", "seed": 3, "version": "v3", "format": "shared_memory"})
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
    init = rl.command({"op": "init", "port": free_port()})
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
        [sys.executable, script, mode, "--url", rl.url, "--port", str(free_port())],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, text=True,
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


# --- generation control with requests in flight ---------------------------------------------


async def metric(rl: RL, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(rl.url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} missing")


class Stream:
    """A streamed /generate request: the chunks so far, the last one."""

    def __init__(self, rl: RL, params: dict[str, Any], **extra: Any) -> None:
        self.body = {"input_ids": PROMPT, "sampling_params": params, "stream": True, **extra}
        self.rl = rl
        self.last: dict[str, Any] = {}

    async def __aenter__(self) -> Stream:
        self.session = aiohttp.ClientSession()
        self.resp = await self.session.post(self.rl.url + "/generate", json=self.body)
        assert self.resp.status == 200
        await self.next()
        return self

    async def next(self) -> bool:
        async for line in self.resp.content:
            if line.startswith(b"data: "):
                if line.strip() == b"data: [DONE]":
                    return False
                self.last = orjson.loads(line[6:])
                return True
        return False

    async def finish(self) -> dict[str, Any]:
        while await self.next():
            pass
        return self.last

    async def __aexit__(self, *exc: object) -> None:
        self.resp.close()
        await self.session.close()


async def wait_running(rl: RL, n: int) -> None:
    for _ in range(200):
        if await metric(rl, "maskgate_worker_running_requests") >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} requests never ran")


async def test_pause_abort_ends_requests_and_queues_new_ones(rl: RL) -> None:
    async with Stream(rl, LONG) as stream:
        whole = asyncio.create_task(
            call(rl.url, "/generate", {"input_ids": PROMPT, "sampling_params": LONG})
        )
        await wait_running(rl, 2)
        status, reply = await call(rl.url, "/pause_generation", {})
        assert status == 200 and reply == {
            "message": "Generation paused successfully.",
            "status": "ok",
        }
        last = await stream.finish()
        status, body = await whole
    for info, ids in (
        (last["meta_info"], last["output_ids"]),
        (body["meta_info"], body["output_ids"]),
    ):
        assert info["finish_reason"] == {"type": "abort", "message": "aborted by /pause_generation"}
        assert 0 < len(ids) < LONG["max_new_tokens"]
    assert status == 200
    # While paused a new request queues; flush_cache refuses while it waits.
    queued = asyncio.create_task(generate(rl))
    await asyncio.sleep(0.5)
    assert not queued.done()
    status, text = await call(rl.url, "/flush_cache", method="GET")
    assert status == 400 and "1 waiting" in text
    status, _ = await call(rl.url, "/continue_generation", {})
    assert status == 200
    out = await queued
    assert out["output_ids"] == rl.expected()
    status, text = await call(rl.url, "/flush_cache", method="GET")
    assert status == 200 and text.startswith("Cache flushed.")


@pytest.mark.parametrize("mode", ["retract", "in_place"])
async def test_pause_keeps_requests_across_a_weight_update(rl: RL, mode: str) -> None:
    old, seed = rl.spec, {"retract": 6, "in_place": 7}[mode]
    n = 300  # long enough to be in flight at the pause; each token checked offline
    async with Stream(rl, {**LONG, "max_new_tokens": n}) as stream:
        status, _ = await call(rl.url, "/pause_generation", {"mode": mode})
        assert status == 200
        status, _ = await call(rl.url, "/flush_cache", method="POST")
        assert status == 400  # the paused request still counts
        body = {"model_path": rl.checkpoint(seed), "weight_version": mode}
        status, reply = await call(rl.url, "/update_weights_from_disk", body)
        assert status == 200 and reply["success"], reply
        rl.spec = rl.checkpoint(seed)
        status, _ = await call(rl.url, "/continue_generation", {})
        last = await stream.finish()
    ids, info = last["output_ids"], last["meta_info"]
    assert info["finish_reason"] == {"type": "length", "length": n} and len(ids) == n
    spans = info["weight_versions"]
    assert len(spans) == 2 and spans[1] == {"version": mode, "start": spans[0]["end"], "end": n}
    k = spans[0]["end"]
    assert 0 < k < n and info["weight_version"] == mode
    assert ids[:k] == offline_greedy(old, PROMPT, k)
    if mode == "retract":  # recomputed from scratch: exactly the new model given the prefix
        assert ids[k:] == offline_greedy(rl.spec, PROMPT + ids[:k], n - k)


async def test_abort_request_by_rid(rl: RL) -> None:
    async with Stream(rl, LONG, rid="rl-abort-me") as stream:
        status, body = await call(rl.url, "/abort_request", {"rid": "rl-abort-me"})
        assert status == 200 and body is None
        last = await stream.finish()
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(last["output_ids"]) < LONG["max_new_tokens"]


async def test_update_weight_version(rl: RL) -> None:
    status, reply = await call(rl.url, "/update_weight_version", {"new_version": "v9"})
    assert status == 200 and reply == {
        "success": True,
        "message": "Weight version updated to v9",
        "new_version": "v9",
    }
    await check_serving(rl, "v9")

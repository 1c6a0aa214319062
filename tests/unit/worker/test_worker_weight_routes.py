"""Weight routes in-process over the real tiny-random runner: the formats trainers send
(flattened_bucket, LocalSerializedTensor, safetensors, SGLang's fused names), gadgets and
non-finite weights refused with the old weights serving, numeric coercion and bounds of the
group init, its wall-clock bound, and SGLang's session, read-out, IPC and memory answers."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient
from safetensors.torch import save, save_file
from torch.distributed import TCPStore

from maskgate.worker.config import WorkerConfig
from maskgate.worker.model import save_tiny_random
from maskgate.worker.model.tiny_random import tiny_weights
from maskgate.worker.server.backend import Backend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakes.trainer_payloads import LocalSerializedTensor, b64, sglang_names, shared
from trainer_payloads import bucket, forking
from worker_calls import GREEDY, greedy, post

CONFIG = WorkerConfig(
    model="tiny-random", device="cpu", max_model_len=64, max_num_seqs=4, weight_update_timeout_s=1
)
HEAD = "lm_head.weight"
QKV = "model.layers.0.self_attn.qkv_proj.weight"


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


@pytest.fixture(name="sglang_modules")
def _sglang_modules() -> Iterator[None]:
    """SGLang's module names for the two dataclasses, so pickle writes them as SGLang does."""
    with sglang_names():
        yield


@pytest.fixture
def restore(backend: Backend) -> Any:
    """Every parameter put back after the test, whatever it changed."""
    model = backend.runner.model  # type: ignore[attr-defined]
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    yield model
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(saved[n])


async def tensor_update(client: TestClient, entry: str, load_format: Any) -> tuple[int, Any]:
    body = {"serialized_named_tensors": [entry], "load_format": load_format}
    return await post(client, "/update_weights_from_tensor", body)


def param(model: Any, name: str) -> torch.Tensor:
    return dict(model.named_parameters())[name.removeprefix("model.")]


async def test_flattened_bucket_as_slime_sends_it(
    client: TestClient, restore: Any, sglang_modules: None
) -> None:
    before = await greedy(client)
    head = param(restore, HEAD)
    new = [(HEAD, -head.detach().clone()), ("model.norm.weight", torch.full((64,), 0.5))]
    status, reply = await tensor_update(client, b64(forking(bucket(new))), "flattened_bucket")
    assert status == 200 and reply["success"], reply
    assert torch.equal(head, new[0][1]) and torch.equal(
        param(restore, "model.norm.weight"), new[1][1]
    )
    assert await greedy(client) != before


async def test_verl_wrapper_and_fused_names(
    client: TestClient, restore: Any, sglang_modules: None
) -> None:
    qkv = param(restore, QKV)
    new = torch.randn(qkv.shape)
    wrapped = LocalSerializedTensor([forking(shared(new))])
    status, reply = await tensor_update(client, b64(forking([(QKV, wrapped)])), "direct")
    assert status == 200 and reply["success"], reply
    assert torch.equal(qkv, new)


async def test_safetensors_payload(client: TestClient, restore: Any) -> None:
    up = "model.layers.1.mlp.up_proj.weight"
    new = torch.randn(128, 64, dtype=torch.bfloat16)
    status, reply = await tensor_update(client, b64(save({up: new})), "safetensors")
    assert status == 200 and reply["success"], reply
    fused = param(restore, "model.layers.1.mlp.gate_up_proj.weight")
    assert torch.equal(fused[128:], new.float())


@pytest.mark.parametrize(
    "named",
    [
        [
            (QKV, torch.ones(128, 64)),
            ("model.layers.0.self_attn.k_proj.weight", torch.ones(32, 64)),
        ],
        [("model.norm.weight", torch.full((64,), float("nan")))],
        [(HEAD, torch.full((256, 64), float("inf")))],
    ],
    ids=["fused and part", "nan", "inf"],
)
async def test_refused_tensor_updates_keep_the_old_weights(
    client: TestClient, restore: Any, named: list[tuple[str, torch.Tensor]]
) -> None:
    before = await greedy(client)
    status, reply = await tensor_update(client, b64(save(dict(named))), "safetensors")
    assert status == 400 and reply["success"] is False, reply
    assert await greedy(client) == before


async def test_a_gadget_over_http_runs_nothing(client: TestClient, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    raw = b"\x80\x04\x8c\x02os\x8c\x06system\x93(\x8c" + bytes([9 + len(str(marker))])
    raw += f"touch -- {marker}".encode() + b"tR."
    before = await greedy(client)
    status, reply = await tensor_update(client, b64(raw), None)
    assert status == 400 and "os.system" in reply["message"], reply
    assert not marker.exists() and await greedy(client) == before


async def test_nan_checkpoint_is_refused(client: TestClient, tmp_path: Path) -> None:
    before = await greedy(client)
    save_tiny_random(tmp_path)
    weights = tiny_weights()
    weights["model.layers.0.mlp.down_proj.weight"][3, 3] = float("nan")
    save_file(weights, str(tmp_path / "model.safetensors"))
    status, reply = await post(client, "/update_weights_from_disk", {"model_path": str(tmp_path)})
    assert status == 400 and "non-finite" in reply["message"], reply
    assert await greedy(client) == before
    info = await (await client.get("/get_model_info")).json()
    assert info["model_path"] == CONFIG.model  # a refused load does not name the checkpoint


async def test_model_info_reports_the_loaded_checkpoint(
    client: TestClient, restore: Any, tmp_path: Path
) -> None:
    save_tiny_random(tmp_path)
    save_file(tiny_weights(), str(tmp_path / "model.safetensors"))
    status, reply = await post(client, "/update_weights_from_disk", {"model_path": str(tmp_path)})
    assert status == 200, reply
    info = await (await client.get("/get_model_info")).json()
    assert info["model_path"] == str(tmp_path) and info["tokenizer_path"] == "tiny-random"


async def test_get_weights_by_name(client: TestClient, restore: Any) -> None:
    k_name = "model.layers.1.self_attn.k_proj.weight"
    fused = param(restore, "model.layers.1.self_attn.qkv_proj.weight")
    r = await client.post("/get_weights_by_name", json={"name": k_name, "truncate_size": 3})
    assert r.status == 200
    assert torch.allclose(torch.tensor(await r.json()), fused[64:67])
    r = await client.get("/get_weights_by_name", json={"name": "layers.0.input_layernorm.weight"})
    values = await r.json()
    assert r.status == 200 and len(values) == 64 and isinstance(values[0], float)
    r = await client.post("/get_weights_by_name", json={"name": "model.layers.9.mlp.x"})
    body = await r.json()
    assert r.status == 400 and body["error"]["message"].startswith("Get parameter by name failed")
    r = await client.post("/get_weights_by_name", json={"name": HEAD, "truncate_size": -1})
    assert r.status == 400 and (await r.json())["error"]["param"] == "truncate_size"


async def test_begin_and_end_weight_update(client: TestClient) -> None:
    assert await post(client, "/end_weight_update", {}) == (400, {
        "success": False,
        "message": "No weight update session is open; call /begin_weight_update first.",
    })  # fmt: skip
    status, reply = await post(client, "/begin_weight_update", {"selector": "all"})
    assert status == 200 and reply["success"] is True, reply
    status, reply = await post(client, "/begin_weight_update", {})
    assert status == 400 and reply["success"] is False
    status, reply = await post(client, "/end_weight_update", {})
    assert status == 200 and reply["success"] is True
    status, reply = await post(client, "/begin_weight_update", {"selector": "draft"})
    assert status == 400 and reply["error"]["param"] == "selector"


async def test_update_weights_from_ipc_answers_as_a_failed_update(client: TestClient) -> None:
    before = await greedy(client)
    body = {"zmq_handles": {"GPU-0": "ipc://engine-0"}, "flush_cache": True}
    status, reply = await post(client, "/update_weights_from_ipc", body)
    assert status == 400 and reply["success"] is False and "not supported" in reply["message"]
    status, reply = await post(client, "/update_weights_from_ipc", {"zmq_handles": ["x"]})
    assert status == 400 and reply["error"]["param"] == "zmq_handles"
    assert await greedy(client) == before


async def test_memory_in_the_wrong_state_is_an_error(client: TestClient) -> None:
    status, reply = await post(client, "/resume_memory_occupation", {"tags": ["weights"]})
    assert status == 400 and reply["error"]["code"] == "memory_not_released"
    status, reply = await post(client, "/resume_memory_occupation", {})
    assert status == 400 and reply["error"]["code"] == "memory_not_released"
    assert (await post(client, "/release_memory_occupation", {"tags": ["kv_cache"]}))[0] == 200
    try:
        status, reply = await post(client, "/release_memory_occupation", {"tags": ["kv_cache"]})
        assert status == 400 and reply["error"]["code"] == "memory_already_released"
        info = await (await client.get("/model_info")).json()
        assert info["released_memory"] == ["kv_cache"]  # the refused call changed nothing
    finally:
        status, reply = await post(client, "/resume_memory_occupation", {"tags": ["kv_cache"]})
    assert status == 200 and reply is None
    assert len(await greedy(client)) == GREEDY["max_new_tokens"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("world_size", 1025, "world_size_too_large"),
        ("world_size", "2x", "invalid_parameter"),
        ("master_port", True, "invalid_parameter"),
        ("master_port", 2.5, "invalid_parameter"),
        ("rank_offset", "0", "invalid_parameter"),
    ],
)
async def test_group_fields_are_bounded(
    client: TestClient, field: str, value: Any, code: str
) -> None:
    body = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2,
            "backend": "gloo", field: value}  # fmt: skip
    status, reply = await post(client, "/init_weights_update_group", body)
    assert status == 400 and reply["error"]["code"] == code and reply["error"]["param"] == field


async def test_group_init_is_bounded_by_its_timeout(client: TestClient) -> None:
    """A trainer that opens its store late and never forms its side: joining waits for the
    store, then for the backend, yet the call fails at the timeout (1 s), not later, and the
    update lock is free at once. Ports as strings, as SGLang's own test sends them."""
    port, stores = _port(), []

    def late_store() -> None:
        time.sleep(0.7)
        stores.append(TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False))

    threading.Thread(target=late_store, daemon=True).start()
    body = {"master_address": "127.0.0.1", "master_port": str(port), "rank_offset": "1",
            "world_size": "2", "group_name": "never", "backend": "gloo"}  # fmt: skip
    t0 = time.monotonic()
    status, reply = await post(client, "/init_weights_update_group", body)
    elapsed = time.monotonic() - t0
    assert status == 400 and "did not form within 1 s" in reply["message"], reply
    assert elapsed < 1.5, elapsed
    t0 = time.monotonic()  # the lock is free: a disk update is answered at once
    status, _ = await post(client, "/update_weights_from_disk", {"model_path": "/nonexistent"})
    assert status == 400 and time.monotonic() - t0 < 0.5
    await asyncio.sleep(1.5)  # the abandoned attempt ends on its own and registers nothing
    status, reply = await post(client, "/destroy_weights_update_group", {"group_name": "never"})
    assert status == 400 and reply["success"] is False
    stores.clear()


async def test_a_broadcast_with_nan_is_refused(client: TestClient) -> None:
    """The trainer (rank 0 of a gloo group, here in-process) broadcasts a NaN weight: the
    update answers 400 after the broadcast, and the old weights keep serving."""
    from maskgate.worker.rl.weight_group import create_group

    before = await greedy(client)
    port = _port()
    init = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": 2, "group_name": "nan", "backend": "gloo"}  # fmt: skip
    group, (status, reply) = await asyncio.gather(
        asyncio.to_thread(create_group, master_address="127.0.0.1", master_port=port, rank=0,
                          world_size=2, group_name="nan", backend="gloo", timeout_s=10),
        post(client, "/init_weights_update_group", init),
    )  # fmt: skip
    assert status == 200, reply
    try:
        body = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]],
                "group_name": "nan"}  # fmt: skip
        nan = torch.full((64,), float("nan"))
        _, (status, reply) = await asyncio.gather(
            asyncio.to_thread(group.broadcast, [nan]),
            post(client, "/update_weights_from_distributed", body),
        )
        assert status == 400 and "non-finite" in reply["message"], reply
        assert await greedy(client) == before
    finally:
        group.destroy()

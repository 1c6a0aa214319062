"""Weight updates and generation control in-process (`create_app` over a real tiny-random
runner): where Hugging Face names land in the fused parameters, body validation (400s),
refused payloads, releasing and resuming memory, and /model_info."""

from __future__ import annotations

import base64
import io
import pickle
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient
from safetensors.torch import save_file

from maskgate.worker.config import WorkerConfig
from maskgate.worker.model import save_tiny_random
from maskgate.worker.model.tiny_random import tiny_weights
from maskgate.worker.rl.weights import WeightMap, WeightUpdateError, apply, parse_dtype
from maskgate.worker.server.backend import Backend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakes.trainer_payloads import b64, shared
from trainer_payloads import forking
from worker_calls import GREEDY, greedy, post

CONFIG = WorkerConfig(model="tiny-random", device="cpu", max_model_len=64, max_num_seqs=4)


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


def payload(named: list[tuple[str, torch.Tensor]]) -> str:
    """As a trainer sends them: shared-memory tensors, by file name (docs/worker.md)."""
    return b64(forking([(n, shared(t)) for n, t in named]))


def test_hf_names_land_in_the_fused_parameters(backend: Backend) -> None:
    model = backend.runner.model  # type: ignore[attr-defined]
    wmap = WeightMap(model)
    weights = tiny_weights()
    assert set(wmap.targets) - set(wmap.parts) == set(weights)  # every checkpoint name
    assert set(wmap.parts) == {n for n in wmap.targets if "qkv_proj" in n or "gate_up_proj" in n}
    qkv = model.layers[1].self_attn.qkv_proj.weight
    before = qkv.detach().clone()
    new_k = torch.full_like(weights["model.layers.1.self_attn.k_proj.weight"], 0.5)
    try:
        apply(wmap.stage([("model.layers.1.self_attn.k_proj.weight", new_k)]))
        q, kv = 64, 32  # tiny-random: 4 heads x 16, 2 kv heads x 16
        assert torch.equal(qkv[q : q + kv], new_k)
        assert torch.equal(qkv[:q], before[:q]) and torch.equal(qkv[q + kv :], before[q + kv :])
    finally:
        with torch.no_grad():
            qkv.copy_(before)


def test_bad_names_shapes_and_dtypes_are_named(backend: Backend) -> None:
    wmap = WeightMap(backend.runner.model)  # type: ignore[attr-defined]
    with pytest.raises(WeightUpdateError, match=r"'model.layers.5.mlp.up_proj.weight' is not"):
        wmap.check(["model.layers.5.mlp.up_proj.weight"], [torch.float32], [[128, 64]])
    with pytest.raises(WeightUpdateError, match=r"shape \[64, 64\], expected \[128, 64\]"):
        wmap.check(["model.layers.0.mlp.up_proj.weight"], [torch.float32], [[64, 64]])
    with pytest.raises(WeightUpdateError, match="floating dtype"):
        wmap.check(["model.norm.weight"], [torch.int32], [[64]])
    assert parse_dtype("torch.bfloat16") is parse_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(WeightUpdateError, match="not supported"):
        parse_dtype("int8")
    # Tensors the model recomputes are accepted and skipped.
    assert wmap.stage([("model.layers.0.self_attn.rotary_emb.inv_freq", torch.ones(8))]) == []


async def test_update_from_tensor_in_process(client: TestClient, backend: Backend) -> None:
    before = await greedy(client)
    head = backend.runner.model.lm_head.weight  # type: ignore[attr-defined]
    saved = head.detach().clone()
    flipped = [("lm_head.weight", -saved)]
    try:
        status, reply = await post(
            client,
            "/update_weights_from_tensor",
            {
                "serialized_named_tensors": [payload(flipped)],
                "load_format": "direct",
                "weight_version": "t1",
            },
        )
        assert status == 200 and reply["success"], reply
        assert torch.equal(head, -saved)
        assert await greedy(client) != before
        status, reply = await post(
            client,
            "/update_weights_from_tensor",
            {"serialized_named_tensors": [payload([("lm_head.weight", saved)])]},
        )
        assert status == 200 and await greedy(client) == before
    finally:
        with torch.no_grad():
            head.copy_(saved)


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("this must never run",))


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (
            {"serialized_named_tensors": [base64.b64encode(pickle.dumps(_Evil())).decode()]},
            400,
            "builtins.print",
        ),
        ({"serialized_named_tensors": ["not base64!"]}, 400, "not valid base64"),
        (
            {"serialized_named_tensors": [payload([("model.norm.weight", torch.ones(3))])]},
            400,
            "shape [3]",
        ),
        ({"serialized_named_tensors": []}, 400, "entry 0"),
        ({"serialized_named_tensors": ["x"], "load_format": "custom.loader"}, 400, "direct"),
    ],
)
async def test_refused_tensor_payloads(
    client: TestClient, body: dict[str, Any], status: int, needle: str
) -> None:
    before = await greedy(client)
    got, reply = await post(client, "/update_weights_from_tensor", body)
    assert got == status
    text = reply["message"] if "message" in reply else reply["error"]["message"]
    assert needle in text, reply
    assert await greedy(client) == before


async def test_file_descriptor_sharing_is_explained(client: TestClient) -> None:
    torch.multiprocessing.set_sharing_strategy("file_descriptor")
    buf = io.BytesIO()
    ForkingPickler(buf).dump([("model.norm.weight", torch.ones(64).share_memory_())])
    body = {"serialized_named_tensors": [base64.b64encode(buf.getvalue()).decode()]}
    status, reply = await post(client, "/update_weights_from_tensor", body)
    assert status == 400 and "set_sharing_strategy('file_system')" in reply["message"]


async def test_checkpoint_missing_a_tensor_is_refused(client: TestClient, tmp_path: Path) -> None:
    save_tiny_random(tmp_path)
    weights = tiny_weights()
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    status, reply = await post(client, "/update_weights_from_disk", {"model_path": str(tmp_path)})
    assert status == 400 and "down_proj" in reply["message"] and reply["num_paused_requests"] == 0


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/pause_generation", {"mode": "sideways"}, "mode"),
        ("/release_memory_occupation", {"tags": ["gpu"]}, "tags"),
        ("/update_weights_from_disk", {}, "model_path"),
        ("/update_weights_from_disk", {"model_path": "x", "is_async": True}, "is_async"),
        ("/update_weights_from_disk", {"model_path": "x", "flush_cache": "yes"}, "flush_cache"),
        ("/init_weights_update_group", {"master_address": "h", "master_port": 1}, "world_size"),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": [], "shapes": []}, "names"),
        (
            "/update_weights_from_distributed",
            {"names": [], "dtypes": [], "shapes": [], "selector": "draft"},
            "selector",
        ),
        ("/update_weight_version", {}, "new_version"),
    ],
)
async def test_bad_bodies_are_400(
    client: TestClient, path: str, body: dict[str, Any], param: str
) -> None:
    status, reply = await post(client, path, body)
    assert status == 400 and reply["error"]["param"] == param, reply


async def test_init_group_needs_a_backend_this_worker_has(client: TestClient) -> None:
    body = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
    status, reply = await post(client, "/init_weights_update_group", body)  # nccl, the default
    assert status == 400 and reply["success"] is False and "needs CUDA" in reply["message"]


async def test_release_and_resume_memory(client: TestClient, backend: Backend) -> None:
    before = await greedy(client)
    status, reply = await post(client, "/release_memory_occupation", {})
    assert status == 200 and reply is None
    runner = backend.runner
    assert runner.kv.k.numel() == 0  # type: ignore[attr-defined]
    assert runner.model.lm_head.weight.numel() == 0  # type: ignore[attr-defined]
    info = await (await client.get("/model_info")).json()
    assert info["released_memory"] == ["kv_cache", "weights"]
    status, reply = await post(client, "/update_weights_from_disk", {"model_path": "x"})
    assert status == 400 and "released" in reply["message"]
    pending = client.post("/generate", json={"input_ids": [3, 4, 5], "sampling_params": GREEDY})
    import asyncio

    task = asyncio.ensure_future(pending)
    await asyncio.sleep(0.3)
    assert not task.done()  # queued until the memory is back
    status, _ = await post(client, "/resume_memory_occupation", {"tags": ["weights"]})
    await asyncio.sleep(0.2)
    assert not task.done()  # the KV cache is still released
    status, _ = await post(client, "/resume_memory_occupation", None)
    resp = await task
    assert (await resp.json())["output_ids"] == before
    assert await greedy(client) == before


async def test_release_refused_while_busy(client: TestClient) -> None:
    await post(client, "/pause_generation", {"mode": "in_place"})
    import asyncio

    task = asyncio.ensure_future(greedy(client))
    await asyncio.sleep(0.2)
    status, reply = await post(client, "/release_memory_occupation", {"tags": ["kv_cache"]})
    assert status == 400 and reply["error"]["code"] == "worker_busy"
    await post(client, "/continue_generation", {})
    assert len(await task) == GREEDY["max_new_tokens"]


async def test_model_info(client: TestClient) -> None:
    for path in ("/model_info", "/get_model_info"):
        info = await (await client.get(path)).json()
        assert info["weight_version"] == "default" and info["model_path"] == "tiny-random"
        assert info["architectures"] == ["LlamaForCausalLM"] and info["is_generation"] is True
    assert await (await client.get("/weight_version")).json() == {"weight_version": "default"}


async def test_openai_responses_carry_the_weight_version(client: TestClient) -> None:
    body = {"prompt": [3, 4, 5], "max_tokens": 3, "temperature": 0, "return_meta_info": True}
    status, reply = await post(client, "/v1/completions", body)
    assert status == 200 and reply["metadata"] == {"weight_version": "default"}
    meta = reply["choices"][0]["meta_info"]
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 3}]

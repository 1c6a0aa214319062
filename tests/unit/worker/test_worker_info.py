"""SGLang's health, facts, load and tokenizer routes on the worker, in-process over the real
tiny-random model: `/health_generate`, `/server_info` (the fields slime's external-engine mode
reads), `/v1/loads` and `/get_load` counted from the scheduler, `/tokenize` and
`/detokenize`, and `/health` after non-finite logits."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient

from maskgate.worker.config import WorkerConfig
from maskgate.worker.server.backend import Backend
from tests.unit.worker.worker_calls import post

CONFIG = WorkerConfig(
    model="tiny-random", device="cpu", max_model_len=2048, max_num_seqs=4, weight_version="v7"
)


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


async def get(client: TestClient, path: str) -> tuple[int, Any]:
    r = await client.get(path)
    return r.status, await r.json()


async def test_health_generate_runs_one_token(client: TestClient) -> None:
    status, body = await get(client, "/health_generate")
    assert (status, body["status"]) == (200, "ok")
    metrics = await (await client.get("/metrics")).text()
    assert "maskgate_worker_generated_tokens_total 1.0" in metrics  # a real engine step
    # While paused no step can run: 503 at once, saying why; continue makes it healthy.
    assert (await post(client, "/pause_generation", {"mode": "in_place"}))[0] == 200
    status, body = await get(client, "/health_generate")
    assert status == 503 and "paused" in body["message"]
    assert (await get(client, "/health"))[0] == 200  # /health does not probe while finite
    assert (await post(client, "/continue_generation", {}))[0] == 200
    assert (await get(client, "/health_generate"))[0] == 200


async def test_health_generate_passes_on_progress_while_slots_are_full(
    client: TestClient,
) -> None:
    """As SGLang's check: with every slot held by long generations the probe queues, and the
    engine stepping on with finite logits is enough."""
    endless = {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}
    tasks = [
        asyncio.create_task(
            post(
                client,
                "/generate",
                {"input_ids": [1, 2], "sampling_params": endless, "rid": f"b{i}"},
            )
        )
        for i in range(4)
    ]
    for _ in range(500):
        if (await get(client, "/v1/loads?include=core"))[1]["loads"][0]["num_running_reqs"] == 4:
            break
        await asyncio.sleep(0.01)
    status, body = await get(client, "/health_generate")
    assert (status, body["status"]) == (200, "ok")
    assert not any(t.done() for t in tasks)  # the slots never freed: progress answered
    assert (await get(client, "/v1/loads"))[1]["loads"][0]["num_waiting_reqs"] == 0  # withdrawn
    assert (await client.post("/abort_request", json={"abort_all": True})).status == 200
    for status, out in await asyncio.gather(*tasks):
        assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"


async def test_server_info_has_what_slime_reads(client: TestClient) -> None:
    for path in ("/server_info", "/get_server_info"):
        status, info = await get(client, path)
        assert status == 200
        # slime's external-engine discovery and its server-args check.
        assert (info["tp_size"], info["pp_size"], info["dp_size"], info["ep_size"]) == (1, 1, 1, 1)
        assert info["moe_dp_size"] == 1 and info["disaggregation_mode"] == "null"
        assert info["encoder_only"] is False and info["enable_memory_saver"] is False
        assert info["dtype"] == "auto"
        # Real settings of this worker.
        assert info["model_path"] == "tiny-random"
        assert (info["context_length"], info["max_running_requests"]) == (2048, 4)
        assert info["max_total_num_tokens"] == 4 * 2048
        assert info["weight_version"] == "v7" and info["role"] == "mixed"
        assert info["max_sequences_per_request"] == CONFIG.max_sequences_per_request
        assert info["api_key_set"] is False
        assert "api_key" not in info and "admin_api_key" not in info


async def test_loads_count_the_scheduler(client: TestClient) -> None:
    status, loads = await get(client, "/v1/loads")
    assert status == 200 and loads["version"] and loads["timestamp"]
    (idle,) = loads["loads"]
    assert (idle["num_running_reqs"], idle["num_waiting_reqs"], idle["num_used_tokens"]) == (
        0,
        0,
        0,
    )
    assert idle["max_total_num_tokens"] == 4 * 2048 and idle["max_running_requests"] == 4
    assert set(idle["memory"]) >= {"token_capacity", "kv_slots"} and "queues" in idle
    # Paused in place, new requests queue: 1 + 2 sequences (n=2) of 3 and 5 prompt tokens.
    assert (await post(client, "/pause_generation", {"mode": "in_place"}))[0] == 200
    greedy = {"temperature": 0, "max_new_tokens": 2}
    bodies = [
        {"input_ids": [1, 2, 3], "sampling_params": greedy},
        {"input_ids": [4, 5, 6, 7, 8], "sampling_params": {**greedy, "n": 2}},
    ]
    tasks = [asyncio.create_task(post(client, "/generate", b)) for b in bodies]
    core: dict[str, Any] = {}
    for _ in range(200):  # until both requests reach the engine
        core = (await get(client, "/v1/loads?include=core"))[1]["loads"][0]
        if core["num_waiting_reqs"] == 3:
            break
        await asyncio.sleep(0.01)
    assert (core["num_running_reqs"], core["num_waiting_reqs"]) == (0, 3)
    assert core["num_total_tokens"] == 3 + 5 + 5 and "memory" not in core
    queues = (await get(client, "/v1/loads?include=queues"))[1]["loads"][0]["queues"]
    assert queues == {"waiting": 3, "paused": 3, "retracted": 0}
    status, legacy = await get(client, "/get_load")
    assert status == 200 and legacy[0]["num_reqs"] == 3
    assert legacy[0]["num_tokens"] == legacy[0]["num_pending_tokens"] == 13
    assert (await post(client, "/continue_generation", {}))[0] == 200
    assert [s for s, _ in await asyncio.gather(*tasks)] == [200, 200]
    done = (await get(client, "/v1/loads"))[1]["loads"][0]
    assert (done["num_running_reqs"], done["num_waiting_reqs"]) == (0, 0)


@pytest.mark.parametrize(
    "query", ["include=core,bogus", "dp_rank=1", "format=prometheus", "dp_rank=x"]
)
async def test_loads_refuse_what_they_cannot_answer(client: TestClient, query: str) -> None:
    status, err = await get(client, f"/v1/loads?{query}")
    assert status == 400 and err["error"]["code"] in ("invalid_parameter", "unsupported_parameter")


async def test_tokenize_and_detokenize_in_sglangs_shapes(
    client: TestClient, backend: Backend
) -> None:
    tok = backend.tokenizer
    status, one = await post(client, "/tokenize", {"prompt": "hello world", "model": "x"})
    assert status == 200
    assert one == {"tokens": tok.encode("hello world"), "count": 5, "max_model_len": 2048}
    status, many = await post(
        client, "/v1/tokenize", {"prompt": ["hi", "hello"], "add_special_tokens": False}
    )
    assert many["tokens"] == [tok.encode(t, add_special_tokens=False) for t in ("hi", "hello")]
    assert many["count"] == [len(t) for t in many["tokens"]]
    status, text = await post(client, "/detokenize", {"tokens": one["tokens"]})
    assert (status, text) == (200, {"text": "hello world"})
    status, texts = await post(client, "/v1/detokenize", {"tokens": many["tokens"]})
    assert texts == {"text": ["hi", "hello"]}
    assert await post(client, "/detokenize", {"tokens": []}) == (200, {"text": ""})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {}),
        ("/tokenize", {"prompt": 5}),
        ("/tokenize", {"prompt": ["a", 1]}),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "no"}),
        ("/detokenize", {"tokens": [1, -1]}),
        ("/detokenize", {"tokens": [1, 512]}),
        ("/detokenize", {"tokens": [[1], [True]]}),
        ("/detokenize", {"tokens": "abc"}),
    ],
)
async def test_tokenizer_routes_refuse_bad_bodies(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    status, err = await post(client, path, body)
    assert (status, err["error"]["code"]) == (400, "invalid_parameter")


@pytest.fixture
def nan_norm(backend: Backend) -> Iterator[torch.Tensor]:
    """The final norm's weight, restored after the test."""
    weight = backend.runner.model.norm.weight  # type: ignore[attr-defined]
    saved = weight.detach().clone()
    yield weight
    with torch.no_grad():
        weight.copy_(saved)


async def test_nonfinite_logits_make_the_worker_unhealthy_until_finite(
    client: TestClient, nan_norm: torch.Tensor
) -> None:
    body = {"input_ids": [3, 4, 5], "sampling_params": {"temperature": 0, "max_new_tokens": 2}}
    assert (await post(client, "/generate", body))[0] == 200
    with torch.no_grad():
        nan_norm.fill_(float("nan"))
    status, err = await post(client, "/generate", body)
    assert (status, err["error"]["code"]) == (500, "worker_numerical_error")
    status, health = await get(client, "/health")
    assert (status, health["status"]) == (503, "non-finite logits")
    assert (await get(client, "/health_generate"))[0] == 503
    assert (await get(client, "/health"))[0] == 503  # still bad: the probe fails again
    with torch.no_grad():
        nan_norm.fill_(1.0)  # fixed weights, as after a weight update
    status, health = await get(client, "/health")  # its probe samples finite logits
    assert (status, health["status"]) == (200, "ok")
    assert (await post(client, "/generate", body))[0] == 200

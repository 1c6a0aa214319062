"""The worker's HTTP surface in-process (`create_app` + aiohttp's test client) over the real
tiny-random model: request validation, finish rules, endpoint shapes and metrics."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from maskgate.worker.config import WorkerConfig
from tests.unit.worker.worker_calls import post

CONFIG = WorkerConfig(
    model="tiny-random", device="cpu", max_model_len=64, max_num_seqs=4, max_body_bytes=4096
)
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"text": "a", "input_ids": [1]}, 400, "invalid_parameter"),
        ({}, 400, "invalid_parameter"),
        ({"input_ids": []}, 400, "invalid_parameter"),
        ({"input_ids": [1, 99999]}, 400, "invalid_parameter"),
        ({"input_ids": list(range(1, 70))}, 400, "context_length_exceeded"),
        ({"text": "a", "sampling_params": {"top_k": "5"}}, 400, "invalid_parameter"),
        ({"text": "a", "sampling_params": {"presence_penalty": 1}}, 400, "unsupported_parameter"),
        ({"text": "a", "return_logprob": "yes"}, 400, "invalid_parameter"),
        ({"text": "a", "return_logprob": True, "top_logprobs_num": -1}, 400, "invalid_parameter"),
        (
            {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2},
            400,
            "invalid_parameter",
        ),
        ({"text": "a", "image_data": "x"}, 400, "unsupported_parameter"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, 400, "invalid_parameter"),
        ({"text": "a", "rid": 5}, 400, "invalid_parameter"),
        # Mask requests go through the gateway's policy functions: same codes.
        ({"text": "a", "return_sampling_mask": "yes"}, 400, "sampling_mask_invalid_param"),
        ({"text": "a", "return_sampling_mask": True}, 400, "sampling_mask_full_vocabulary"),
        (
            {
                "text": "a",
                "return_sampling_mask": True,
                "sampling_params": {"top_k": 5000, "top_p": 0.5},
            },
            400,
            "sampling_mask_top_k_exceeds_cap",
        ),
    ],
)
async def test_generate_rejects_bad_requests_with_a_code(
    client: TestClient, body: dict[str, Any], status: int, code: str
) -> None:
    got, err = await post(client, "/generate", body)
    assert (got, err["error"]["code"]) == (status, code), err
    assert err["error"]["message"]


async def test_malformed_and_oversized_bodies(client: TestClient) -> None:
    r = await client.post("/generate", data=b"{not json")
    assert (r.status, (await r.json())["error"]["code"]) == (400, "invalid_json")
    r = await client.post("/generate", data=b'{"text": "' + b"a" * 5000 + b'"}')
    assert (r.status, (await r.json())["error"]["code"]) == (413, "body_too_large")
    r = await client.get("/nope")
    assert (r.status, (await r.json())["error"]["code"]) == (404, "not_found")


async def test_chat_mask_rules_match_the_gateway(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "top_p": 0.5}
    status, err = await post(client, "/v1/chat/completions", {**body, "return_sampling_mask": True})
    assert (status, err["error"]["code"]) == (400, "sampling_mask_requires_meta_info")
    masked = {**body, "return_sampling_mask": True, "return_meta_info": True, "stream": True}
    status, err = await post(client, "/v1/chat/completions", masked)
    assert (status, err["error"]["code"]) == (400, "sampling_mask_stream_unsupported")
    status, err = await post(client, "/v1/chat/completions", {"messages": []})
    assert (status, err["error"]["code"]) == (400, "invalid_parameter")


async def test_stop_string_cuts_the_text_and_names_the_match(client: TestClient) -> None:
    _, free = await post(client, "/generate", {"input_ids": [1, 5, 9], "sampling_params": GREEDY})
    text = free["text"]
    stop = text[4:6]
    assert len(stop) == 2 and stop.strip(), f"greedy text too short to pick a stop: {text!r}"
    sp = {**GREEDY, "stop": [stop]}
    _, cut = await post(client, "/generate", {"input_ids": [1, 5, 9], "sampling_params": sp})
    assert cut["text"] == text[: text.index(stop)]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut["output_ids"] == free["output_ids"][: len(cut["output_ids"])]


async def test_stop_token_ids_max_new_tokens_and_zero(client: TestClient) -> None:
    _, free = await post(client, "/generate", {"input_ids": [1, 5, 9], "sampling_params": GREEDY})
    ids = free["output_ids"]
    assert free["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    stop_id = ids[3]
    sp = {**GREEDY, "stop_token_ids": [stop_id]}
    _, cut = await post(client, "/generate", {"input_ids": [1, 5, 9], "sampling_params": sp})
    assert cut["output_ids"] == ids[: ids.index(stop_id) + 1]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    sp0 = {"max_new_tokens": 0}
    _, none = await post(client, "/generate", {"input_ids": [1, 5], "sampling_params": sp0})
    assert none["output_ids"] == [] and none["meta_info"]["completion_tokens"] == 0


async def test_seeded_sampling_is_reproducible_and_n_choices_differ(client: TestClient) -> None:
    sp = {"temperature": 1.0, "top_k": 50, "max_new_tokens": 8, "sampling_seed": 77, "n": 3}
    body = {"input_ids": [1, 2, 3], "sampling_params": sp}
    _, first = await post(client, "/generate", body)
    _, again = await post(client, "/generate", body)
    assert [r["output_ids"] for r in first] == [r["output_ids"] for r in again]
    assert len({tuple(r["output_ids"]) for r in first}) == 3


async def test_completions_and_chat_shapes(client: TestClient) -> None:
    status, r = await post(
        client, "/v1/completions", {"prompt": [[1, 2], [3, 4]], "max_tokens": 3, "n": 2}
    )
    assert status == 200 and r["object"] == "text_completion"
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert r["usage"]["prompt_tokens"] == 4  # each prompt once, whatever n is
    status, r = await post(
        client,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 4,
            "top_k": 4,
            "return_sampling_mask": True,
            "return_meta_info": True,
            "return_token_ids": True,
            "sampling_mask_mode": "bounded",
        },
    )
    assert status == 200, r
    choice = r["choices"][0]
    meta = choice["meta_info"]
    assert choice["message"]["role"] == "assistant" and len(choice["token_ids"]) == 4
    assert meta["output_token_sampling_mask_truncated"] == [False] * 4
    assert [len(m) for m in meta["output_token_sampling_mask"]] == [4] * 4


async def test_info_endpoints_and_metric_names(client: TestClient) -> None:
    assert (await (await client.get("/health")).json())["status"] == "ok"
    models = await (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == "tiny-random"
    info = await (await client.get("/get_model_info")).json()
    assert info["vocab_size"] == 512 and info["max_model_len"] == 64
    await post(client, "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2}})
    text = await (await client.get("/metrics")).text()
    for name in (
        "maskgate_worker_waiting_requests",
        "maskgate_worker_running_requests",
        "maskgate_worker_batch_size_bucket",
        "maskgate_worker_generated_tokens_total",
        "maskgate_worker_prompt_tokens_total",
        "maskgate_worker_ttft_seconds_bucket",
        "maskgate_worker_itl_seconds_bucket",
        "maskgate_worker_mask_overflows_total",
        "maskgate_worker_mask_kernel_seconds_bucket",
        "maskgate_worker_sampler_fallback_rows_total",
        "maskgate_worker_step_seconds_bucket",
        "maskgate_worker_step_device_wait_seconds_bucket",
        "maskgate_worker_kv_usage_ratio",
    ):
        assert f"\n{name}" in text, name
    assert "maskgate_worker_generated_tokens_total 2.0" in text


async def test_request_ids_follow_x_request_id_or_rid(client: TestClient) -> None:
    headers = {"x-request-id": "req-42"}
    r = await client.post(
        "/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 1}}, headers=headers
    )
    assert (await r.json())["meta_info"]["id"] == "req-42"
    r = await client.post(
        "/generate",
        json={"text": ["a", "b"], "rid": "mine", "sampling_params": {"max_new_tokens": 1}},
        headers=headers,
    )
    assert [x["meta_info"]["id"] for x in await r.json()] == ["mine-0", "mine-1"]
    r = await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}, headers=headers)
    assert (await r.json())["id"] == "cmpl-req-42"


async def test_streams_never_send_text_past_a_stop_string(client: TestClient) -> None:
    body: dict[str, Any] = {"input_ids": [1, 5, 9], "sampling_params": GREEDY}
    _, free = await post(client, "/generate", body)
    stop = free["text"][4:6]
    sp = {**GREEDY, "stop": [stop]}
    stream = {**body, "sampling_params": sp, "stream": True, "incremental_streaming_output": True}
    r = await client.post("/generate", json=stream)
    pieces = [
        orjson.loads(line[6:])["text"]
        for line in (await r.text()).splitlines()
        if line.startswith("data: {")
    ]
    assert "".join(pieces) == free["text"][: free["text"].index(stop)]
    assert all(stop not in "".join(pieces[: i + 1]) for i in range(len(pieces)))

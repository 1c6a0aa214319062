"""What the worker answers, in-process over the tiny-random model: request ids held once,
weight-version spans (never empty, once per stream), OpenAI answers' version fields and chat
streams with several choices."""

from __future__ import annotations

import asyncio
import base64
from itertools import pairwise
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp.test_utils import TestClient

from maskgate.worker.config import WorkerConfig
from maskgate.worker.engine.engine import Event
from maskgate.worker.server.backend import Backend
from maskgate.worker.server.output import SeqOutput
from tests.unit.worker.worker_calls import post

# top lists over the whole tiny-random vocabulary (512 ids) are the token_ids_logprob oracle
CONFIG = WorkerConfig(
    model="tiny-random",
    device="cpu",
    max_model_len=64,
    max_num_seqs=4,
    max_top_logprobs_num=512,
)
LONG = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


def events(text: str) -> list[Any]:
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def first_chunk(client: TestClient, body: dict[str, Any]) -> Any:
    """Start a stream and wait for its first chunk: the request is then in flight."""
    resp = await client.post("/generate", json={**body, "stream": True})
    assert resp.status == 200
    await resp.content.readuntil(b"\n\n")
    return resp


async def version(client: TestClient) -> str:
    return str((await (await client.get("/weight_version")).json())["weight_version"])


async def test_a_rid_in_flight_is_refused_and_free_again_after(client: TestClient) -> None:
    held = await first_chunk(
        client, {"input_ids": [1, 2, 3], "rid": "dup", "sampling_params": LONG}
    )
    one = {"input_ids": [4, 5], "sampling_params": {"max_new_tokens": 1}}
    for body, kw in (
        ({**one, "rid": "dup"}, {}),
        ({**one, "input_ids": [[4], [5]], "rid": ["x", "dup"]}, {}),
        (one, {"headers": {"x-request-id": "dup"}}),  # the rid the header names
    ):
        status, err = await post(client, "/generate", body, **kw)
        assert status == 400 and err["error"]["code"] == "duplicate_request_id", err
        assert err["error"]["message"] == "Duplicate request ID detected: dup"
    status, err = await post(
        client, "/v1/completions", {"prompt": "a", "max_tokens": 1}, headers={"x-request-id": "dup"}
    )
    assert status == 400 and err["error"]["code"] == "duplicate_request_id"
    # The refusals touched nothing: aborting by the rid ends the one holder.
    assert (await client.post("/abort_request", json={"rid": "dup"})).status == 200
    last = events(await held.text())[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    status, reply = await post(client, "/generate", {**one, "rid": "dup"})
    assert status == 200 and reply["meta_info"]["id"] == "dup"


async def test_a_batch_naming_one_rid_twice_is_refused(client: TestClient) -> None:
    body = {"input_ids": [[1], [2]], "rid": ["a", "a"], "sampling_params": {"max_new_tokens": 1}}
    status, err = await post(client, "/generate", body)
    assert status == 400 and err["error"]["code"] == "duplicate_request_id"


async def test_an_abort_before_the_first_token_reports_the_admitted_version(
    client: TestClient,
) -> None:
    admitted = await version(client)
    await post(client, "/pause_generation", {"mode": "in_place"})
    try:
        body = {"input_ids": [1, 2], "rid": "early", "sampling_params": LONG}
        task = asyncio.ensure_future(post(client, "/generate", body))
        await asyncio.sleep(0.2)
        update = {"new_version": admitted + "-next", "abort_all_requests": False}
        assert (await post(client, "/update_weight_version", update))[0] == 200
        assert (await client.post("/abort_request", json={"rid": "early"})).status == 200
        status, reply = await task
    finally:
        await post(client, "/continue_generation", {})
    meta = reply["meta_info"]
    assert status == 200 and meta["finish_reason"]["type"] == "abort" and not reply["output_ids"]
    assert meta["weight_versions"] == [{"version": admitted, "start": 0, "end": 0}]
    assert meta["weight_version"] == admitted
    status, reply = await post(
        client, "/generate", {**body, "sampling_params": {"max_new_tokens": 0}}
    )
    assert reply["meta_info"]["weight_versions"] == [
        {"version": admitted + "-next", "start": 0, "end": 0}
    ]


@pytest.mark.parametrize("incremental", [False, True])
async def test_stream_chunks_carry_each_span_once(client: TestClient, incremental: bool) -> None:
    now = await version(client)
    body = {
        "input_ids": [1, 2, 3],
        "sampling_params": {**LONG, "max_new_tokens": 12},
        "incremental_streaming_output": incremental,
        "stream": True,
    }
    chunks = [
        c["meta_info"] for c in events(await (await client.post("/generate", json=body)).text())
    ]
    assert chunks[-1]["weight_versions"] == [{"version": now, "start": 0, "end": 12}]
    for n, meta in enumerate(chunks[:-1], start=1):  # the one span, grown by a token each
        assert meta["weight_versions"] == [{"version": now, "start": 0, "end": n}]


def test_stream_spans_across_an_update() -> None:
    out = SeqOutput("r", 3, want_mask=False, bounded=False, admitted_version="v1")
    sent = []
    for token, ver in enumerate(["v1", "v1", "v2", "v2"]):
        out.apply(Event(index=0, token=token, weight_version=ver))
        sent.append(out.meta_info(stream=True)["weight_versions"])
    out.apply(Event(index=0, token=9, weight_version="v2", finish_reason="length"))
    final = out.meta_info(stream=True)["weight_versions"]
    v1 = {"version": "v1", "start": 0}
    assert sent == [
        [{**v1, "end": 1}],
        [{**v1, "end": 2}],
        [{"version": "v2", "start": 2, "end": 3}],
        [{"version": "v2", "start": 2, "end": 4}],
    ]
    assert final == [{**v1, "end": 2}, {"version": "v2", "start": 2, "end": 5}]
    assert out.meta_info()["weight_versions"] == final  # whole answers: always the full list


async def test_openai_answers_carry_versions_in_metadata_and_sglext(client: TestClient) -> None:
    now = await version(client)
    spans = [{"version": now, "start": 0, "end": 3}]
    body = {"prompt": [3, 4, 5], "max_tokens": 3, "temperature": 0}
    status, reply = await post(client, "/v1/completions", body)
    assert status == 200 and reply["metadata"] == {"weight_version": now}
    assert reply["sglext"] == {"weight_version": now, "weight_versions": spans}
    r = await client.post("/v1/completions", json={**body, "stream": True})
    chunks = events(await r.text())
    assert all("metadata" not in c for c in chunks[:-1])
    assert chunks[-1]["metadata"] == {"weight_version": now}
    assert chunks[-1]["sglext"]["weight_versions"] == spans


async def test_chat_streams_send_one_choice_per_chunk(client: TestClient) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "n": 3,
        "temperature": 0,
        "stream": True,
    }
    r = await client.post("/v1/chat/completions", json=body)
    chunks = events(await r.text())
    assert all(len(c["choices"]) == 1 for c in chunks)
    roles = [c["choices"][0] for c in chunks if "role" in c["choices"][0]["delta"]]
    assert [c["index"] for c in roles] == [0, 1, 2]
    assert all(c["delta"] == {"role": "assistant", "content": ""} for c in roles)


def int32s(b64: str) -> list[int]:
    return np.frombuffer(base64.b64decode(b64), dtype="<i4").tolist()


TOP_P = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 6, "sampling_seed": 5}


async def test_top_p_token_ids_are_the_sampling_masks(client: TestClient) -> None:
    prompt = {"input_ids": [7, 8, 9], "return_logprob": True}
    _, masked = await post(
        client, "/generate", {**prompt, "sampling_params": TOP_P, "return_sampling_mask": True}
    )
    custom = {"return_top_p_token_ids": True, "some_processor_arg": [1, 2]}
    sp = {**TOP_P, "custom_params": custom}
    status, replay = await post(client, "/generate", {**prompt, "sampling_params": sp})
    assert status == 200, replay
    meta, masks = replay["meta_info"], masked["meta_info"]["output_token_sampling_mask"]
    assert replay["output_ids"] == masked["output_ids"]
    assert "output_token_sampling_mask" not in meta  # not a mask request
    offsets = int32s(meta["top_p_token_offsets"])
    ids = int32s(meta["top_p_token_ids"])
    assert offsets[0] == 0 and offsets[-1] == len(ids) and len(offsets) == 7
    assert [ids[a:b] for a, b in pairwise(offsets)] == masks
    assert any(len(m) > 1 for m in masks)
    # The log-prob of each token is the one over its ids, as slime's SGLang answers.
    sampling = masked["meta_info"]["output_token_sampling_logprobs"]
    # (to float32 rounding: the replay's prompt comes from the prefix cache, docs/worker.md)
    assert [lp for lp, _, _ in meta["output_token_logprobs"]] == pytest.approx(sampling, abs=2e-5)
    raw = [lp for lp, _, _ in masked["meta_info"]["output_token_logprobs"]]
    assert all(r <= s for r, s in zip(raw, sampling, strict=True)) and raw != sampling


async def test_top_p_token_ids_come_on_the_final_chunk(client: TestClient) -> None:
    sp = {**TOP_P, "custom_params": {"return_top_p_token_ids": True}}
    body = {"input_ids": [7, 8, 9], "sampling_params": sp, "stream": True}
    chunks = [
        c["meta_info"] for c in events(await (await client.post("/generate", json=body)).text())
    ]
    assert all("top_p_token_ids" not in m for m in chunks[:-1])
    assert len(int32s(chunks[-1]["top_p_token_offsets"])) == TOP_P["max_new_tokens"] + 1
    greedy = {"temperature": 0, "max_new_tokens": 3, "custom_params": sp["custom_params"]}
    _, reply = await post(client, "/generate", {"input_ids": [7], "sampling_params": greedy})
    assert int32s(reply["meta_info"]["top_p_token_ids"]) == reply["output_ids"]  # [token] each
    unfiltered = {"max_new_tokens": 2, "custom_params": sp["custom_params"]}  # the vocabulary
    _, reply = await post(client, "/generate", {"input_ids": [7], "sampling_params": unfiltered})
    assert "top_p_token_ids" not in reply["meta_info"]


@pytest.mark.parametrize(
    ("custom", "code"),
    [
        ("x", "invalid_parameter"),
        ({"return_top_p_token_ids": "yes"}, "invalid_parameter"),
    ],
)
async def test_bad_custom_params_are_refused(client: TestClient, custom: Any, code: str) -> None:
    body = {"input_ids": [7], "sampling_params": {**TOP_P, "custom_params": custom}}
    status, err = await post(client, "/generate", body)
    assert status == 400 and err["error"]["code"] == code, err


async def test_top_p_token_ids_are_bounded_like_masks(client: TestClient) -> None:
    sp = {**TOP_P, "n": 64, "max_new_tokens": 60, "custom_params": {"return_top_p_token_ids": True}}
    body = {"input_ids": [[1]] * 5, "sampling_params": sp}
    status, err = await post(client, "/generate", body)
    assert status == 400 and err["error"]["code"] == "sampling_mask_payload_too_large", err


async def test_completions_echo_prepends_the_prompt_and_its_logprobs(
    client: TestClient, backend: Backend
) -> None:
    base = {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "logprobs": 2}
    _, plain = await post(client, "/v1/completions", base)
    status, echoed = await post(client, "/v1/completions", {**base, "echo": True})
    assert status == 200, echoed
    got, want = echoed["choices"][0], plain["choices"][0]
    prompt_text = backend.tokenizer.decode([5, 6, 7], skip_special_tokens=True)
    assert got["text"] == prompt_text + want["text"]
    lp, out = got["logprobs"], want["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][3:] == out["token_logprobs"]
    assert lp["top_logprobs"][3:] == out["top_logprobs"]
    # The prompt's log-probs are /generate's input_token_logprobs from position 0.
    body = {"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": 0}
    _, gen = await post(client, "/generate", {**body, "sampling_params": {"max_new_tokens": 0}})
    assert lp["token_logprobs"][:3] == [v for v, _, _ in gen["meta_info"]["input_token_logprobs"]]
    assert len(lp["tokens"]) == len(lp["text_offset"]) == 6


async def test_completions_echo_with_no_new_tokens_scores_the_prompt(client: TestClient) -> None:
    body = {"prompt": "hello there", "max_tokens": 0, "echo": True, "logprobs": 0}
    status, reply = await post(client, "/v1/completions", body)
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["text"] == "hello there" and reply["usage"]["completion_tokens"] == 0
    assert len(choice["logprobs"]["token_logprobs"]) == reply["usage"]["prompt_tokens"]
    assert all(v is not None for v in choice["logprobs"]["token_logprobs"][1:])


async def test_completions_echo_streams_the_prompt_first(client: TestClient) -> None:
    body = {"prompt": ["ab", "cd"], "max_tokens": 4, "temperature": 0}
    _, plain = await post(client, "/v1/completions", body)
    r = await client.post("/v1/completions", json={**body, "echo": True, "stream": True})
    texts = ["", ""]
    for chunk in events(await r.text()):
        for c in chunk["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == ["ab" + plain["choices"][0]["text"], "cd" + plain["choices"][1]["text"]]
    chat = {"messages": [{"role": "user", "content": "hi"}], "echo": True}
    status, err = await post(client, "/v1/chat/completions", chat)
    assert status == 400 and err["error"]["code"] == "unsupported_parameter"


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_token_ids_logprob_match_the_full_top_lists(
    client: TestClient, temperature: float
) -> None:
    ids = [5, 1, 300, 5]  # any order, repeats allowed: answered in the asked order
    sp = {"temperature": temperature, "max_new_tokens": 4, "sampling_seed": 3}
    body = {
        "input_ids": [7, 8, 9, 10],
        "sampling_params": sp,
        "return_logprob": True,
        "logprob_start_len": 1,
        "top_logprobs_num": 512,  # the whole tiny-random vocabulary: an oracle for every id
        "token_ids_logprob": ids,
    }
    status, reply = await post(client, "/generate", body)
    assert status == 200, reply
    meta = reply["meta_info"]
    out, inp = meta["output_token_ids_logprobs"], meta["input_token_ids_logprobs"]
    assert len(out) == 4 and len(inp) == 3 and inp[0] is None
    for got, top in zip(
        inp[1:] + out, meta["input_top_logprobs"][1:] + meta["output_top_logprobs"], strict=True
    ):
        full = {i: v for v, i, _ in top}
        assert [i for _, i, _ in got] == ids
        assert [v for v, _, _ in got] == pytest.approx([full[i] for i in ids], abs=1e-5)
    for (lp, token, _), got in zip(meta["output_token_logprobs"], out, strict=True):
        assert dict((i, v) for v, i, _ in got).get(token, lp) == pytest.approx(lp, abs=1e-5)


async def test_token_ids_logprob_per_prompt_and_streams(client: TestClient) -> None:
    body = {
        "input_ids": [[7, 8], [9, 10]],
        "sampling_params": {"temperature": 0, "max_new_tokens": 2},
        "return_logprob": True,
        "token_ids_logprob": [[3], [4, 6]],
        "return_text_in_logprobs": True,
    }
    status, reply = await post(client, "/generate", body)
    assert status == 200, reply
    assert [
        [i for _, i, _ in pos] for pos in reply[1]["meta_info"]["output_token_ids_logprobs"]
    ] == [[4, 6]] * 2
    assert all(
        isinstance(t, str) for _, _, t in reply[0]["meta_info"]["output_token_ids_logprobs"][0]
    )
    assert reply[0]["meta_info"]["input_token_ids_logprobs"] == []  # logprob_start_len -1
    stream = {**body, "input_ids": [7, 8], "token_ids_logprob": [3], "stream": True}
    stream["incremental_streaming_output"] = True
    chunks = events(await (await client.post("/generate", json=stream)).text())
    assert [len(c["meta_info"]["output_token_ids_logprobs"]) for c in chunks] == [1, 1]
    _, plain = await post(client, "/generate", {**body, "token_ids_logprob": None})
    assert "output_token_ids_logprobs" not in plain[0]["meta_info"]


@pytest.mark.parametrize(
    "value",
    [
        list(range(512)) + list(range(513)),  # more than 1024 ids
        [512],  # outside the vocabulary
        [1.5],
        "5",
        [[1], [2]],  # per-prompt lists on a single prompt
    ],
)
async def test_bad_token_ids_logprob_are_refused(client: TestClient, value: Any) -> None:
    body = {"input_ids": [7], "return_logprob": True, "token_ids_logprob": value}
    status, err = await post(client, "/generate", body)
    assert status == 400 and err["error"]["code"] == "invalid_parameter", err
    assert err["error"]["param"].startswith("token_ids_logprob")

"""The worker's bounds on one request, in-process over the real tiny-random model: sequences
(prompts x n), prompt bytes before tokenization, top_logprobs_num and prompt log-prob rows,
each refused with its code before anything reaches the engine; and tokenization off the event
loop, so /health answers while a prompt is being tokenized."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from maskgate.worker.config import WorkerConfig
from maskgate.worker.server import create_app
from maskgate.worker.server.backend import Backend
from tests.unit.worker.worker_calls import post

CONFIG = WorkerConfig(
    model="tiny-random",
    device="cpu",
    max_model_len=64,
    max_num_seqs=4,
    max_sequences_per_request=8,
    max_prompt_bytes=1024,
    max_prompt_logprob_rows=10,
)
GREEDY = {"temperature": 0, "max_new_tokens": 2}


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


async def prompt_tokens_seen(client: TestClient) -> str:
    text = await (await client.get("/metrics")).text()
    return next(ln for ln in text.splitlines() if ln.startswith("maskgate_worker_prompt_tokens"))


BIG = "é" * 600  # 1200 UTF-8 bytes in 600 characters


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        # prompts x n: 3 x 3 = 9 > 8, in each shape of request.
        (
            "/generate",
            {"text": ["a", "b", "c"], "sampling_params": {"n": 3}},
            400,
            "too_many_sequences",
        ),
        (
            "/generate",
            {"input_ids": [[1], [2], [3]], "sampling_params": [{"n": 3}, {"n": 3}, {"n": 3}]},
            400,
            "too_many_sequences",
        ),
        ("/v1/completions", {"prompt": ["a", "b", "c"], "n": 3}, 400, "too_many_sequences"),
        ("/v1/completions", {"prompt": [[1], [2], [3]], "n": 3}, 400, "too_many_sequences"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "n": 9},
            400,
            "too_many_sequences",
        ),
        ("/tokenize", {"prompt": ["a"] * 9}, 400, "too_many_sequences"),
        # prompt bytes, counted in UTF-8 before any tokenizer runs.
        ("/generate", {"text": BIG}, 413, "prompt_too_large"),
        ("/generate", {"text": ["a" * 600, "b" * 600]}, 413, "prompt_too_large"),
        ("/v1/completions", {"prompt": BIG}, 413, "prompt_too_large"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": BIG}]},
            413,
            "prompt_too_large",
        ),
        ("/tokenize", {"prompt": BIG}, 413, "prompt_too_large"),
        # top_logprobs_num: at most 20 (max_top_logprobs_num).
        (
            "/generate",
            {"input_ids": [1, 2], "return_logprob": True, "top_logprobs_num": 21},
            400,
            "invalid_parameter",
        ),
        # prompt log-prob rows: (8 - 0) x 2 = 16 > 10.
        (
            "/generate",
            {
                "input_ids": list(range(1, 9)),
                "return_logprob": True,
                "logprob_start_len": 0,
                "sampling_params": {**GREEDY, "n": 2},
            },
            400,
            "prompt_logprobs_too_large",
        ),
    ],
)
async def test_bounds_refuse_before_any_work(
    client: TestClient, path: str, body: dict[str, Any], status: int, code: str
) -> None:
    before = await prompt_tokens_seen(client)
    got, err = await post(client, path, body)
    assert (got, err["error"]["code"]) == (status, code), err
    assert await prompt_tokens_seen(client) == before  # nothing reached the engine


async def test_requests_at_the_bounds_pass(client: TestClient) -> None:
    ok = [
        ("/generate", {"text": ["a", "b"], "sampling_params": {**GREEDY, "n": 4}}),
        ("/tokenize", {"prompt": "é" * 300}),  # 600 bytes, counted exactly
        (
            "/generate",
            {
                "input_ids": [1, 2],
                "return_logprob": True,
                "top_logprobs_num": 20,
                "sampling_params": GREEDY,
            },
        ),
        (
            "/generate",
            {
                "input_ids": list(range(1, 9)),
                "return_logprob": True,
                "logprob_start_len": 4,
                "sampling_params": {**GREEDY, "n": 2},
            },
        ),
        ("/v1/completions", {"prompt": ["a", "b"], "n": 4, "max_tokens": 2}),
    ]
    for path, body in ok:
        status, out = await post(client, path, body)
        assert status == 200, (path, out)


class GatedTokenizer:
    """The real tokenizer, held at a gate on long texts until the test opens it; records the
    thread each encode ran on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.started = threading.Event()
        self.release = threading.Event()
        self.threads: list[int] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > 100:
            self.threads.append(threading.get_ident())
            self.started.set()
            if not self.release.wait(5):
                raise RuntimeError("the gate was never opened")
        return list(self.inner.encode(text, add_special_tokens=add_special_tokens))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
async def gated(backend: Backend) -> AsyncIterator[tuple[TestClient, GatedTokenizer]]:
    gate = GatedTokenizer(backend.tokenizer)
    slow = Backend(runner=backend.runner, tokenizer=gate, model_name=backend.model_name)
    async with TestClient(TestServer(create_app(CONFIG, backend=slow))) as c:
        yield c, gate


async def test_health_answers_while_a_prompt_is_tokenized(
    gated: tuple[TestClient, GatedTokenizer],
) -> None:
    client, gate = gated
    long = "hello world " * 40  # more tokens than max_model_len once tokenized
    task = asyncio.create_task(post(client, "/generate", {"text": long}))
    assert await asyncio.to_thread(gate.started.wait, 10)
    r = await asyncio.wait_for(client.get("/health"), 4)  # the loop is free meanwhile
    assert r.status == 200
    gate.release.set()
    status, err = await task
    assert (status, err["error"]["code"]) == (400, "context_length_exceeded")
    assert gate.threads and threading.get_ident() not in gate.threads

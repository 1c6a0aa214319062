"""The SGLang mask engine of `FakeUpstream(engine="sglang")`, written to follow SGLang's HTTP
server for the routes and errors the gateway meets in front of an SGLang mask pool. It is not
a real SGLang: no model runs, and the masks are seeded random supports.

What it follows (python/sglang/srt/entrypoints/http_server.py and the OpenAI serving code):
- `/generate` takes SGLang's request fields only (an unknown top-level field fails request
  validation: 400 `{"object": "error", "message", "type": "Bad Request", "param": null,
  "code": 400}`); a request SGLang refuses answers 400 `{"error": {"message"}}`; a stream
  that fails after its 200 sends `data: {"error": {"message"}}` then `data: [DONE]`.
- Mask requests need a positive, finite `top_k` no larger than `--sampling-mask-max-tokens`
  (SGLang's messages); masks come back as lists (`output_token_sampling_mask`).
- `/v1/chat/completions` refuses with `{"object": "error", "message", "type", "param",
  "code"}`, and puts each choice's `meta_info` in the choice.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

SGLangHandler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]

_GENERATE_FIELDS = frozenset(
    {
        "text",
        "input_ids",
        "sampling_params",
        "return_sampling_mask",
        "stream",
        "rid",
        "return_logprob",
        "return_text_in_logprobs",
    }
)


@dataclass
class SGLangEngine:
    """The SGLang knobs of a FakeUpstream. Its methods read the FakeUpstream's `vocab_size`."""

    max_mask_tokens: int = 4096  # --sampling-mask-max-tokens
    tokens: int = 5  # generated tokens per answer
    chat_error: str | None = None  # /v1/chat/completions answers this error (400)
    stream_error_after: int | None = None  # /generate streams fail after this many events

    if TYPE_CHECKING:  # the FakeUpstream's, read here

        @property
        def vocab_size(self) -> int | None: ...

    def sglang_route(self, path: str) -> SGLangHandler | None:
        """The POST handler of `path` (it takes the request and its parsed JSON body)."""
        routes: dict[str, SGLangHandler] = {
            "/generate": self._sglang_generate,
            "/v1/chat/completions": self._sglang_chat,
        }
        return routes.get(path)

    async def _sglang_generate(self, request: web.Request, body: Any) -> web.StreamResponse:
        unknown = sorted(set(body) - _GENERATE_FIELDS)
        if unknown:  # FastAPI's request validation, answered as SGLang's ErrorResponse
            return openai_error(f"unexpected keyword argument '{unknown[0]}'", "Bad Request")
        size = len(body["text"]) if isinstance(body.get("text"), list) else None
        sps = body.get("sampling_params") or {}
        items = sps if isinstance(sps, list) else [sps] * (size or 1)
        flags = body.get("return_sampling_mask", False)
        flags = flags if isinstance(flags, list) else [flags] * (size or 1)
        for sp, flag in zip(items, flags, strict=True):
            message = self._mask_error(sp) if flag else None
            if message is not None:
                return web.json_response({"error": {"message": message}}, status=400)
        answers = [
            self._sglang_answer(sp, i, flag)
            for i, (sp, flag) in enumerate(zip(items, flags, strict=True))
        ]
        if body.get("stream"):
            return await self._sglang_stream(request, answers, many=size is not None)
        return web.json_response(answers if size is not None else answers[0])

    def _mask_error(self, sp: dict[str, Any]) -> str | None:
        """SGLang's checks of a mask request's top_k (its messages)."""
        top_k = sp.get("top_k", -1)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k == -1:
            return (
                "return_sampling_mask requires finite top_k; top_p-only sampling is valid "
                "but can return huge masks in the tail, blowing up metadata, so we need a "
                "safety cap."
            )
        if top_k < 1:
            return "return_sampling_mask requires top_k to be a positive integer."
        if top_k > self.max_mask_tokens:
            return (
                f"return_sampling_mask requires top_k <= {self.max_mask_tokens} "
                "(--sampling-mask-max-tokens); use top_k=1 for greedy sampling."
            )
        return None

    def _sglang_answer(self, sp: dict[str, Any], i: int, mask: bool) -> dict[str, Any]:
        vocab = self.vocab_size
        assert vocab is not None, "the sglang engine answers with a vocabulary"
        rng = random.Random(sp.get("sampling_seed", 0) * 1000 + i)
        k = min(sp.get("top_k", 1), vocab)
        masks = [rng.sample(range(vocab), rng.randint(1, k)) for _ in range(self.tokens)]
        ids = [m[rng.randrange(len(m))] for m in masks]
        meta: dict[str, Any] = {"id": f"r{i}", "finish_reason": {"type": "length"}}
        meta["completion_tokens"] = self.tokens
        if mask:
            meta["output_token_sampling_mask"] = masks
            meta["output_token_sampling_logprobs"] = [-1.0] * self.tokens
            meta["output_token_sampling_mask_length"] = self.tokens
        return {"text": "x" * self.tokens, "output_ids": ids, "meta_info": meta}

    async def _sglang_stream(
        self, request: web.Request, answers: list[dict[str, Any]], many: bool
    ) -> web.StreamResponse:
        """One event per answer per token, each with that token only (incremental output)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = 0
        for t in range(self.tokens):
            for k, ans in enumerate(answers):
                if self.stream_error_after is not None and sent == self.stream_error_after:
                    error = {"error": {"message": "the scheduler aborted the request"}}
                    await resp.write(b"data: " + orjson.dumps(error) + b"\n\n")
                    await resp.write(b"data: [DONE]\n\n")
                    return resp
                meta = dict(ans["meta_info"])
                if "output_token_sampling_mask" in meta:
                    meta["output_token_sampling_mask"] = meta["output_token_sampling_mask"][
                        t : t + 1
                    ]
                    meta["output_token_sampling_logprobs"] = [-1.0]
                    meta["output_token_sampling_mask_length"] = 1
                event: dict[str, Any] = {"text": "x", "output_ids": ans["output_ids"][t : t + 1]}
                event["meta_info"] = meta
                if many:
                    event["index"] = k
                await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
                sent += 1
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _sglang_chat(self, request: web.Request, body: Any) -> web.Response:
        if self.chat_error is not None:
            return openai_error(self.chat_error, "BadRequestError")
        sp = {"top_k": body.get("top_k", -1), "sampling_seed": body.get("seed") or 0}
        message = self._mask_error(sp) if body.get("return_sampling_mask") else None
        if message is not None:
            return openai_error(message, "BadRequestError")
        answer = self._sglang_answer(sp, 0, bool(body.get("return_sampling_mask")))
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": answer["text"]},
            "finish_reason": "length",
            "meta_info": answer["meta_info"],
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = answer["output_ids"]
        return web.json_response(
            {"id": "chatcmpl-1", "object": "chat.completion", "model": "fake", "choices": [choice]}
        )


def openai_error(message: str, kind: str) -> web.Response:
    """SGLang's OpenAI-style ErrorResponse, status 400."""
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": 400}
    return web.json_response(body, status=400)

"""The fake upstream: one configurable aiohttp server, on port 0, standing for the LLM servers
behind the gateway.

`FakeUpstream(engine=...)` picks the surface it speaks:
- "openai" (default): the slice of SGLang's surface the gateway touches (OpenAI routes,
  `/generate` single and batch, `/v1/models`), masks in SGLang's list shape; any other path
  answers 200 `{"path", "upstream"}`. No weight versions: version probes get 404.
- "sglang": SGLang's own request validation and error shapes (sglang_engine.py).
- "rl": the RL control routes with a real engine's state (rl_engine.py); unknown paths 404.

Every engine records each request it receives (`received`), answers `/health` by `healthy`,
and applies the fault knobs (delay, status sequence, failure rate, per-route answers) to
every path but the probes. Knobs are plain attributes; change them at any time.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from fakes.rl_engine import RLEngine
from fakes.serve import start_site
from fakes.sglang_engine import SGLangEngine

ENGINES = ("openai", "sglang", "rl")
PROBES = frozenset({"/health", "/get_model_info", "/model_info", "/get_weight_version"})
_MODEL_PATHS = {"openai": "fake", "sglang": "fake-sglang", "rl": "fake-rl"}


@dataclass
class Received:
    method: str
    path: str
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class FakeUpstream(RLEngine, SGLangEngine):
    """Knobs common to every engine here; the engines' own ones in RLEngine and SGLangEngine."""

    engine: str = "openai"  # one of ENGINES
    name: str = "upstream"
    model_path: str | None = None  # in the model-info answers; None: the engine's default
    healthy: bool = True  # GET /health answers 200, else 503
    vocab_size: int | None = 1000  # in /get_model_info; None: it answers 404
    delay_s: float = 0.0  # before the response headers
    statuses: deque[int] = field(default_factory=deque)  # answered first, one per request
    fail_rate: float = 0.0  # chance of a 500 (seeded, reproducible)
    # path -> the JSON answer (200), or a function of the parsed body that returns it
    answers: dict[str, Any] = field(default_factory=dict)
    # "openai" engine: streams (SSE) and masks
    ttfb_s: float = 0.0  # streams: headers -> first chunk
    chunk_gap_s: float = 0.0  # streams: between chunks
    chunks: int = 3  # SSE chunks per stream
    drop_after: int | None = None  # streams: cut the connection after this many chunks
    drop_mid_frame: bool = False  # ...after sending half of the next frame
    mask_ids_outside: bool = False  # answer masks whose sampled token is not inside
    # what it saw
    received: list[Received] = field(default_factory=list)
    health_checks: int = 0
    cancelled: int = 0  # requests whose connection went away before the answer ended
    url: str = ""
    _rng: random.Random = field(default_factory=lambda: random.Random(1234))
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r}: expected one of {ENGINES}")
        if self.model_path is None:
            self.model_path = _MODEL_PATHS[self.engine]

    # --- what it received ---
    @property
    def requests(self) -> list[Received]:
        """Received requests other than health, model-info and weight-version probes."""
        return [r for r in self.received if r.path not in PROBES]

    @property
    def calls(self) -> list[tuple[str, Any]]:
        """(path, parsed body) of each request other than the probes, in order."""
        return [(r.path, _parse(r.body)) for r in self.requests]

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def bodies(self, path: str | None = None) -> list[Any]:
        """The parsed bodies of the requests other than the probes (to `path` if given)."""
        return [b for p, b in self.calls if path is None or p == path]

    # --- serving ---
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._resumed.set()
        self._runner, self.url = await start_site(self.app(), host, port, handler_cancellation=True)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        path = request.path
        self.received.append(Received(request.method, path, CIMultiDict(request.headers), raw))
        if path == "/health":
            self.health_checks += 1
            return web.Response(status=200 if self.healthy else 503)
        if path in PROBES:
            return await self._rl(path, raw) if self.engine == "rl" else self._model_info(path)
        try:
            injected = await self._inject(path, raw)
            if injected is not None:
                return injected
            if self.engine == "rl":
                return await self._rl(path, raw)
            if self.engine == "sglang":
                return await self._sglang(request, raw)
            return await self._openai(request, raw)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def _model_info(self, path: str) -> web.Response:
        if path != "/get_model_info" or self.vocab_size is None:
            return web.Response(status=404)
        return web.json_response({"model_path": self.model_path, "vocab_size": self.vocab_size})

    async def _inject(self, path: str, raw: bytes) -> web.Response | None:
        """The fault knobs, then the per-route answers; None: the engine answers."""
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.statuses:
            status = self.statuses.popleft()
            if status != 200:
                return web.json_response({"error": f"status {status}"}, status=status)
        if self.fail_rate and self._rng.random() < self.fail_rate:
            return web.json_response({"error": "injected"}, status=500)
        if path in self.answers:
            answer = self.answers[path]
            return web.json_response(answer(_lenient(raw)) if callable(answer) else answer)
        return None

    async def _rl(self, path: str, raw: bytes) -> web.StreamResponse:
        handler = self.rl_route(path)
        body = _parse(raw)
        if handler is None:
            return web.json_response({"error": {"message": f"no route {path}"}}, status=404)
        return await handler(body)

    async def _sglang(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        handler = self.sglang_route(request.path)
        if handler is None:
            return web.Response(status=404)
        if request.method != "POST":
            return web.Response(status=405)
        return await handler(request, orjson.loads(raw))

    # --- the "openai" engine ---
    async def _openai(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        body = _lenient(raw)
        if isinstance(body, dict) and body.get("stream"):
            return await self._stream(request)
        return web.Response(
            body=orjson.dumps(self._answer(request.path, body)),
            content_type="application/json",
            headers={"X-Upstream": self.name},
        )

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.ttfb_s:
            await asyncio.sleep(self.ttfb_s)
        for i in range(self.chunks):
            if i and self.chunk_gap_s:
                await asyncio.sleep(self.chunk_gap_s)
            chunk = {
                "choices": [{"index": 0, "delta": {"content": f"t{i}"}}],
                "upstream": self.name,
            }
            frame = b"data: " + orjson.dumps(chunk) + b"\n\n"
            if self.drop_after is not None and i == self.drop_after:
                if self.drop_mid_frame:
                    await resp.write(frame[: len(frame) // 2])
                    await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.close()  # an upstream crash mid-stream
                return resp
            await resp.write(frame)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _answer(self, path: str, body: Any) -> Any:
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
        if path == "/generate":
            size = len(body["text"]) if isinstance(body.get("text"), list) else None
            flags = body.get("return_sampling_mask")
            if size is None:
                return self._generate_item(body, 0, bool(flags))
            flags = flags if isinstance(flags, list) else [bool(flags)] * size
            return [self._generate_item(body, i, flags[i]) for i in range(size)]
        if path in ("/v1/chat/completions", "/v1/completions"):
            return self._completion(path, body)
        return {"path": path, "upstream": self.name}

    def _completion(self, path: str, body: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if path == "/v1/chat/completions":
            choice["message"] = {"role": "assistant", "content": "hi"}
        else:
            choice["text"] = "hi"
        if body.get("return_sampling_mask"):
            ids, meta = self._mask_meta(body)
            choice["meta_info"] = meta
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
        return {"id": "cmpl-1", "object": "chat.completion", "model": "fake", "choices": [choice]}

    def _generate_item(self, body: dict[str, Any], i: int, mask: bool) -> dict[str, Any]:
        item: dict[str, Any] = {"text": "hi", "meta_info": {"id": f"r{i}", "finish_reason": None}}
        if mask:
            ids, meta = self._mask_meta(body)
            item["output_ids"] = ids
            item["meta_info"].update(meta)
        return item

    def _mask_meta(self, body: dict[str, Any], tokens: int = 4) -> tuple[list[int], dict[str, Any]]:
        """SGLang's fields: per generated token, a mask (ids) and the sampled log-prob."""
        masks = [[10 + t, 20 + t, 30 + t] for t in range(tokens)]
        ids = [m[0] for m in masks]
        if self.mask_ids_outside:
            ids[-1] = 999
        meta = {
            "output_token_sampling_mask": masks,
            "output_token_sampling_logprobs": [-0.5] * tokens,
            "output_token_sampling_mask_length": tokens,
        }
        return ids, meta


def _parse(raw: bytes) -> Any:
    """A JSON body, {} when empty."""
    return orjson.loads(raw) if raw.strip() else {}


def _lenient(raw: bytes) -> Any:
    """A JSON body, {} when empty or not JSON: the fake answers any body; only the gateway
    judges them."""
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {}

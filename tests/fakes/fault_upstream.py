"""A fake LLM server that injects faults, run as its own process so tests can kill or stop it.

It answers the shapes the gateway proxies: OpenAI `/v1/chat/completions` and
`/v1/completions` (JSON, or SSE with `stream=true`) and SGLang `/generate` (single or batch,
JSON, or SSE), with the mask fields of docs/design.md whenever `return_sampling_mask` is
set. Every generated token's mask holds the sampled token, so the gateway's invariant check
never fires on a healthy answer.

Knobs (see `Knobs`) are set at start with `--knob value` flags and changed at run time with
`POST /_control` (a JSON object of knob values; `reset_counts: true` also clears the
counters and recorded bodies). `GET /_control` returns counters and the
bodies received. The first line on stdout is `LISTENING <port>`.

    python fault_upstream.py --port 0 --chunks 20 --chunk-gap-s 0.1 --fault-rate 0.01
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import sys
import time
from typing import Any

from aiohttp import web

FAULT_KINDS = ("503", "500", "abort", "reset")


@dataclasses.dataclass
class Knobs:
    chunks: int = 4  # generated tokens per answer (SSE chunks per stream)
    chunk_gap_s: float = 0.0  # pause between two SSE chunks
    ttfb_s: float = 0.0  # pause before the response headers
    trickle_gap_s: float = 0.0  # > 0: write every body byte alone, this long apart
    healthy: bool = True  # GET /health answers 200, else 503
    fail_next: int = 0  # the next N generation requests answer `fail_status`
    fail_status: int = 503
    fault_rate: float = 0.0  # probability that a generation request gets a random fault
    fault_mix: str = "503,500,abort"  # kinds drawn for random faults, from FAULT_KINDS
    abort_after: int = -1  # streams: drop the connection after this many chunks
    hang_after: int = -1  # streams: go silent (connection open) after this many chunks
    vocab_size: int = 32000
    keep_bodies: int = 2000  # bodies kept for GET /_control


class Upstream:
    def __init__(self, knobs: Knobs, seed: int = 0) -> None:
        self.knobs = knobs
        self.rng = random.Random(seed)
        self.counts: collections.Counter[str] = collections.Counter()
        self.bodies: collections.deque[dict[str, Any]] = collections.deque(maxlen=knobs.keep_bodies)
        self.raw: collections.deque[bytes] = collections.deque(maxlen=knobs.keep_bodies)
        self.inflight = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/_control", self.stats)
        app.router.add_post("/_control", self.control)
        return app

    # --- control -------------------------------------------------------------------------

    async def control(self, request: web.Request) -> web.Response:
        updates = await request.json()
        if updates.pop("reset_counts", False):
            self.counts.clear()
            self.bodies.clear()
            self.raw.clear()
        for name, value in updates.items():
            if not hasattr(self.knobs, name):
                return web.json_response({"error": f"unknown knob {name}"}, status=400)
            setattr(self.knobs, name, value)
        return web.json_response(dataclasses.asdict(self.knobs))

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"counts": dict(self.counts), "inflight": self.inflight, "bodies": list(self.bodies)}
        )

    async def health(self, request: web.Request) -> web.Response:
        self.counts["health"] += 1
        self.counts["health_ok" if self.knobs.healthy else "health_fail"] += 1
        return web.json_response({}, status=200 if self.knobs.healthy else 503)

    async def models(self, request: web.Request) -> web.Response:
        self.counts["models"] += 1
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": "fake", "vocab_size": self.knobs.vocab_size})

    # --- generation ----------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        path = request.path
        self.counts["requests"] += 1
        self.counts[path] += 1
        self.bodies.append({"path": path, "body": body, "rid": request.headers.get("x-request-id")})
        self.raw.append(raw)
        self.inflight += 1
        try:
            return await self._answer(request, path, body)
        finally:
            self.inflight -= 1

    async def _answer(self, request: web.Request, path: str, body: Any) -> web.StreamResponse:
        k = self.knobs
        fault = self._draw_fault()
        if k.ttfb_s > 0:
            await asyncio.sleep(k.ttfb_s)
        if fault in ("503", "500"):
            status = int(fault)
            return web.json_response(
                {"error": {"message": f"injected {status}", "code": "injected"}}, status=status
            )
        if fault == "reset":
            request.transport.abort()  # type: ignore[union-attr]
            return web.Response()  # never written: the connection is gone
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "body must be an object"}}, status=400)
        abort_after = k.abort_after if fault != "abort" else self.rng.randint(1, k.chunks)
        if body.get("stream") is True:
            return await self._stream(request, path, body, abort_after)
        try:
            payload = json.dumps(_complete(path, body, k.chunks)).encode()
        except (TypeError, ValueError, IndexError, AttributeError):
            # A general request this fake cannot make sense of still gets a 200: the gateway
            # forwards whatever JSON object it is given, and that is what is tested.
            payload = b'{"object": "unanswerable"}'
        if k.trickle_gap_s > 0 or fault == "abort":
            return await self._write_slowly(request, payload, abort_at=fault == "abort")
        return web.Response(body=payload, content_type="application/json")

    def _draw_fault(self) -> str | None:
        k = self.knobs
        if k.fail_next > 0:
            k.fail_next -= 1
            self.counts[f"fault_{k.fail_status}"] += 1
            return str(k.fail_status)
        if k.fault_rate > 0 and self.rng.random() < k.fault_rate:
            kind = self.rng.choice([m for m in k.fault_mix.split(",") if m])
            self.counts[f"fault_{kind}"] += 1
            return kind
        return None

    async def _write_slowly(
        self, request: web.Request, payload: bytes, *, abort_at: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(payload)
        await resp.prepare(request)
        if abort_at:  # half the body, then the connection drops
            await resp.write(payload[: len(payload) // 2])
            request.transport.abort()  # type: ignore[union-attr]
            return resp
        for i in range(len(payload)):
            await resp.write(payload[i : i + 1])
            await asyncio.sleep(self.knobs.trickle_gap_s)
        await resp.write_eof()
        return resp

    async def _stream(
        self, request: web.Request, path: str, body: dict[str, Any], abort_after: int
    ) -> web.StreamResponse:
        k = self.knobs
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        frames = _stream_frames(path, body, k.chunks)
        for i, frame in enumerate(frames):
            if i == abort_after:
                self.counts["aborted_streams"] += 1
                request.transport.abort()  # type: ignore[union-attr]
                return resp
            if i == k.hang_after:
                self.counts["hung_streams"] += 1
                await asyncio.sleep(3600)
            if i > 0 and k.chunk_gap_s > 0:
                await asyncio.sleep(k.chunk_gap_s)
            if k.trickle_gap_s > 0:
                for j in range(len(frame)):
                    await resp.write(frame[j : j + 1])
                    await asyncio.sleep(k.trickle_gap_s)
            else:
                await resp.write(frame)
        await resp.write_eof()
        self.counts["completed_streams"] += 1
        return resp


# --- answer shapes ---------------------------------------------------------------------------


def _mask_fields(params: dict[str, Any], tokens: int, start: int = 0) -> dict[str, Any]:
    """Masks that hold the sampled token: support size min(top_k, 8), else 3 ids."""
    top_k = params.get("top_k")
    size = min(top_k, 8) if isinstance(top_k, int) and top_k > 0 else 3
    masks, logprobs = [], []
    for t in range(start, start + tokens):
        token = 100 + t
        masks.append([token] + [1000 + t * 10 + j for j in range(size - 1)])
        logprobs.append(-0.25 if size > 1 else 0.0)
    return {
        "output_token_sampling_mask": masks,
        "output_token_sampling_logprobs": logprobs,
        "output_token_sampling_mask_length": tokens,
    }


def _generate_items(body: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """(sampling params, wants mask) per item of a /generate request; one item if single."""
    text, ids = body.get("text"), body.get("input_ids")
    size = None
    if isinstance(text, list):
        size = len(text)
    elif isinstance(ids, list) and ids and isinstance(ids[0], list):
        size = len(ids)
    sp, flag = body.get("sampling_params") or {}, body.get("return_sampling_mask")
    n = size or 1
    sps = sp if isinstance(sp, list) else [sp] * n
    flags = flag if isinstance(flag, list) else [bool(flag)] * n
    return [(s if isinstance(s, dict) else {}, bool(f)) for s, f in zip(sps, flags, strict=False)]


def _tokens(limit: Any, chunks: int) -> int:
    return min(limit, chunks) if isinstance(limit, int) and limit >= 0 else chunks


def _complete(path: str, body: dict[str, Any], chunks: int) -> Any:
    if path == "/generate":
        out = []
        items = _generate_items(body)
        for i, (sp, mask) in enumerate(items):
            n = _tokens(sp.get("max_new_tokens"), chunks)
            meta: dict[str, Any] = {"id": f"{body.get('rid', 'r')}-{i}", "completion_tokens": n}
            meta["finish_reason"] = {"type": "length", "length": n}
            if mask:
                meta.update(_mask_fields(sp, n))
            out.append(
                {"text": " tok" * n, "output_ids": [100 + t for t in range(n)], "meta_info": meta}
            )
        single = (
            len(items) == 1
            and not isinstance(body.get("text"), list)
            and not (
                isinstance(body.get("input_ids"), list)
                and body["input_ids"]
                and isinstance(body["input_ids"][0], list)
            )
        )
        return out[0] if single else out
    limit = body.get("max_tokens", body.get("max_completion_tokens"))
    n = _tokens(limit, chunks)
    choices = []
    n_choices = body.get("n")
    for i in range(min(n_choices, 4) if isinstance(n_choices, int) else 1):
        choice: dict[str, Any] = {"index": i, "finish_reason": "length"}
        if path == "/v1/chat/completions":
            choice["message"] = {"role": "assistant", "content": " tok" * n}
        else:
            choice["text"] = " tok" * n
        if body.get("return_sampling_mask") is True:
            choice["meta_info"] = _mask_fields(body, n)
        choices.append(choice)
    kind = "chat.completion" if path == "/v1/chat/completions" else "text_completion"
    return {
        "id": "cmpl-fake",
        "object": kind,
        "created": int(time.time()),
        "model": "fake",
        "choices": choices,
        "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
    }


def _stream_frames(path: str, body: dict[str, Any], chunks: int) -> list[bytes]:
    frames = []
    for t in range(chunks):
        if path == "/generate":
            items = _generate_items(body)
            sp = items[0][0] if items else {}
            meta: dict[str, Any] = {"id": str(body.get("rid", "r")), "completion_tokens": t + 1}
            if body.get("return_sampling_mask") is True:
                meta.update(_mask_fields(sp, t + 1))
            event: dict[str, Any] = {"text": " tok" * (t + 1), "meta_info": meta}
        elif path == "/v1/chat/completions":
            event = {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": "fake",
                "choices": [{"index": 0, "delta": {"content": f" tok{t}"}, "finish_reason": None}],
            }
        else:
            event = {
                "id": "c",
                "object": "text_completion",
                "model": "fake",
                "choices": [{"index": 0, "text": f" tok{t}", "finish_reason": None}],
            }
        frames.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return frames


def _parse_args(argv: list[str]) -> tuple[Knobs, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    for f in dataclasses.fields(Knobs):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            p.add_argument(
                flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=f.default
            )
        else:
            p.add_argument(
                flag, type={"int": int, "float": float}.get(str(f.type), str), default=f.default
            )
    args = p.parse_args(argv)
    knobs = Knobs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Knobs)})
    return knobs, args


async def _serve(knobs: Knobs, args: argparse.Namespace) -> None:
    runner = web.AppRunner(Upstream(knobs, args.seed).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    print(f"LISTENING {port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    knobs, args = _parse_args(sys.argv[1:] if argv is None else argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(knobs, args))


if __name__ == "__main__":
    main()

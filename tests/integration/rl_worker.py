"""A fake SGLang engine with the RL control endpoints, for the gateway's control-plane tests.

It keeps the state a real engine keeps for these calls (weight version, paused, process
groups, memory released) with SGLang's shapes and statuses, records every call in order, and
has knobs for failures and delays. `/generate` waits while paused, as SGLang's does, and
stamps `meta_info.weight_version`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

_PROBES = frozenset({"/health", "/model_info", "/get_weight_version", "/get_model_info"})


@dataclass
class RLWorker:
    name: str = "worker"
    version: str | None = "0"
    fail_update: bool = False  # weight updates answer `fail_status` success=false
    fail_status: int = 400  # 400: refused (old weights kept); 500: failed after accepting
    fail_pause: bool = False
    fail_release: bool = False  # /release_memory_occupation answers 400
    generate_s: float = 0.0  # how long a /generate runs (a pause with mode abort ends it)
    model_path: str = "fake-rl"  # in /model_info
    update_delay_s: float = 0.0
    flush_busy: int = 0  # /flush_cache answers 400 this many times first
    refuse_version: bool = False  # updates ignore weight_version; /update_weight_version 400
    healthy: bool = True
    init_gate: asyncio.Event | None = None  # set: inits return (the trainer "joined")
    paused: bool = False
    released: bool = False
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)  # (path, body), probes left out
    url: str = ""
    _resumed: asyncio.Event = field(default_factory=asyncio.Event)
    _aborted: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]

    def bodies(self, path: str) -> list[Any]:
        return [b for p, b in self.calls if p == path]

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self._resumed.set()
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw) if raw.strip() else {}
        path = request.path
        if path not in _PROBES:
            self.calls.append((path, body))
        handler = getattr(self, "_" + path.strip("/").replace("/", "_"), None)
        if handler is None:
            return web.json_response({"error": {"message": f"no route {path}"}}, status=404)
        return await handler(request, body)

    # --- probes ---
    async def _health(self, request: web.Request, body: Any) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _model_info(self, request: web.Request, body: Any) -> web.Response:
        return web.json_response(
            {"model_path": self.model_path, "is_generation": True, "weight_version": self.version}
        )

    async def _get_weight_version(self, request: web.Request, body: Any) -> web.Response:
        return web.json_response({"weight_version": self.version})

    async def _v1_loads(self, request: web.Request, body: Any) -> web.Response:
        running = sum(1 for p, _ in self.calls if p == "/generate")
        load = {"dp_rank": 0, "num_running_reqs": 0 if self.paused else running % 3}
        return web.json_response({"loads": [{**load, "num_waiting_reqs": 0}]})

    # --- inference ---
    async def _generate(self, request: web.Request, body: Any) -> web.Response:
        await self._resumed.wait()  # SGLang: new requests wait while generation is paused
        assert not self.released, "a request reached a worker whose memory is released"
        meta = {"id": body.get("rid"), "weight_version": self.version, "finish_reason": None}
        if self.generate_s:
            aborted = self._aborted
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(aborted.wait(), self.generate_s)
            finish = {"type": "abort"} if aborted.is_set() else {"type": "length"}
            meta = {**meta, "weight_version": self.version, "finish_reason": finish}
        if isinstance(body, dict) and "weight_versions_span" in body:
            meta["weight_versions"] = body["weight_versions_span"]
        return web.json_response({"text": "hi", "meta_info": meta, "worker": self.name})

    # --- control ---
    def _result(self, ok: bool, message: str, **extra: Any) -> web.Response:
        data = {"success": ok, "message": message, **extra}
        return web.json_response(data, status=200 if ok else 400)

    async def _pause_generation(self, request: web.Request, body: Any) -> web.Response:
        if self.fail_pause:
            return web.json_response({"error": {"message": "pause failed"}}, status=500)
        self.paused = True
        self._resumed.clear()
        if body.get("mode", "abort") == "abort":  # in-flight requests end now
            self._aborted.set()
            self._aborted = asyncio.Event()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue_generation(self, request: web.Request, body: Any) -> web.Response:
        self.paused = False
        self._resumed.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def _flush_cache(self, request: web.Request, body: Any) -> web.Response:
        if self.flush_busy > 0:
            self.flush_busy -= 1
            return web.Response(status=400, text="Flush cache failed.\n")
        return web.Response(text="Cache flushed.\n")

    async def _update(self, body: dict[str, Any], what: str) -> web.Response:
        if self.update_delay_s:
            await asyncio.sleep(self.update_delay_s)
        if self.fail_update:
            message = f"Failed to update weights ({what}). Rolling back."
            return web.json_response(
                {"success": False, "message": message}, status=self.fail_status
            )
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None and not self.refuse_version:
            self.version = body["weight_version"]
            message += f" Weight version updated to {self.version}."
        return self._result(True, message, num_paused_requests=0)

    async def _update_weights_from_disk(self, request: web.Request, body: Any) -> web.Response:
        return await self._update(body, "disk")

    async def _update_weights_from_tensor(self, request: web.Request, body: Any) -> web.Response:
        return await self._update(body, "tensor")

    async def _update_weights_from_distributed(
        self, request: web.Request, body: Any
    ) -> web.Response:
        if body.get("group_name", "weight_update_group") not in self.groups:
            return self._result(False, "Failed to receive weights: no such group")
        return await self._update(body, "distributed")

    async def _init_weights_update_group(self, request: web.Request, body: Any) -> web.Response:
        if self.init_gate is not None:
            await self.init_gate.wait()  # rendezvous: blocks until the trainer joins
        self.groups[body.get("group_name", "weight_update_group")] = body
        return self._result(True, "Succeeded to initialize custom process group.")

    async def _destroy_weights_update_group(self, request: web.Request, body: Any) -> web.Response:
        if self.groups.pop(body.get("group_name", "weight_update_group"), None) is None:
            return self._result(False, "The group to be destroyed does not exist.")
        return self._result(True, "Succeeded to destroy custom process group.")

    async def _update_weight_version(self, request: web.Request, body: Any) -> web.Response:
        if self.refuse_version:
            return self._result(False, "Failed to update weight version: refused")
        self.version = body["new_version"]
        return self._result(
            True, f"Weight version updated to {self.version}", new_version=self.version
        )

    async def _abort_request(self, request: web.Request, body: Any) -> web.Response:
        return web.Response(status=200)

    async def _release_memory_occupation(self, request: web.Request, body: Any) -> web.Response:
        if self.fail_release:
            return web.json_response({"error": {"message": "already released"}}, status=400)
        self.released = True
        return web.json_response(None)

    async def _resume_memory_occupation(self, request: web.Request, body: Any) -> web.Response:
        self.released = False
        return web.json_response(None)

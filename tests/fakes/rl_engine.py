"""The RL control surface of `FakeUpstream(engine="rl")`: a fake SGLang engine as RL trainers
drive it through the gateway.

It keeps the state a real engine keeps for these calls (weight version, paused, process
groups, memory released) with SGLang's shapes and statuses. `/generate` waits while paused,
as SGLang's does, and stamps `meta_info.weight_version`. Routes it does not know answer 404.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

RLHandler = Callable[[Any], Awaitable[web.StreamResponse]]


@dataclass
class RLEngine:
    """The RL knobs and state of a FakeUpstream (plain attributes; change them at any time).
    Its methods read the FakeUpstream's `name`, `model_path` and `calls`."""

    version: str | None = "0"
    fail_update: bool = False  # weight updates answer `fail_status` success=false
    fail_status: int = 400  # 400: refused (old weights kept); 500: failed after accepting
    fail_pause: bool = False
    fail_release: bool = False  # /release_memory_occupation answers 400
    generate_s: float = 0.0  # how long a /generate runs (a pause with mode abort ends it)
    update_delay_s: float = 0.0
    flush_busy: int = 0  # /flush_cache answers 400 this many times first
    refuse_version: bool = False  # updates ignore weight_version; /update_weight_version 400
    init_gate: asyncio.Event | None = None  # set: inits return (the trainer "joined")
    paused: bool = False
    released: bool = False
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    _resumed: asyncio.Event = field(default_factory=asyncio.Event)
    _aborted: asyncio.Event = field(default_factory=asyncio.Event)

    if TYPE_CHECKING:  # the FakeUpstream's, read here

        @property
        def name(self) -> str: ...
        @property
        def model_path(self) -> str | None: ...
        @property
        def calls(self) -> list[tuple[str, Any]]: ...

    def rl_route(self, path: str) -> RLHandler | None:
        """The handler of `path` (it takes the parsed JSON body), None when there is none."""
        routes: dict[str, RLHandler] = {
            "/model_info": self._rl_model_info,
            "/get_weight_version": self._rl_weight_version,
            "/v1/loads": self._v1_loads,
            "/generate": self._rl_generate,
            "/pause_generation": self._pause_generation,
            "/continue_generation": self._continue_generation,
            "/flush_cache": self._flush_cache,
            "/update_weights_from_disk": lambda body: self._update(body, "disk"),
            "/update_weights_from_tensor": lambda body: self._update(body, "tensor"),
            "/update_weights_from_distributed": self._update_weights_from_distributed,
            "/init_weights_update_group": self._init_weights_update_group,
            "/destroy_weights_update_group": self._destroy_weights_update_group,
            "/update_weight_version": self._update_weight_version,
            "/abort_request": self._abort_request,
            "/release_memory_occupation": self._release_memory_occupation,
            "/resume_memory_occupation": self._resume_memory_occupation,
        }
        return routes.get(path)

    # --- probes ---
    async def _rl_model_info(self, body: Any) -> web.Response:
        return web.json_response(
            {
                "model_path": self.model_path,
                "is_generation": True,
                "weight_version": self.version,
            }
        )

    async def _rl_weight_version(self, body: Any) -> web.Response:
        return web.json_response({"weight_version": self.version})

    async def _v1_loads(self, body: Any) -> web.Response:
        running = sum(1 for p, _ in self.calls if p == "/generate")
        load = {"dp_rank": 0, "num_running_reqs": 0 if self.paused else running % 3}
        return web.json_response({"loads": [{**load, "num_waiting_reqs": 0}]})

    # --- inference ---
    async def _rl_generate(self, body: Any) -> web.Response:
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

    async def _pause_generation(self, body: Any) -> web.Response:
        if self.fail_pause:
            return web.json_response({"error": {"message": "pause failed"}}, status=500)
        self.paused = True
        self._resumed.clear()
        if body.get("mode", "abort") == "abort":  # in-flight requests end now
            self._aborted.set()
            self._aborted = asyncio.Event()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue_generation(self, body: Any) -> web.Response:
        self.paused = False
        self._resumed.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def _flush_cache(self, body: Any) -> web.Response:
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

    async def _update_weights_from_distributed(self, body: Any) -> web.Response:
        if body.get("group_name", "weight_update_group") not in self.groups:
            return self._result(False, "Failed to receive weights: no such group")
        return await self._update(body, "distributed")

    async def _init_weights_update_group(self, body: Any) -> web.Response:
        if self.init_gate is not None:
            await self.init_gate.wait()  # rendezvous: blocks until the trainer joins
        self.groups[body.get("group_name", "weight_update_group")] = body
        return self._result(True, "Succeeded to initialize custom process group.")

    async def _destroy_weights_update_group(self, body: Any) -> web.Response:
        if self.groups.pop(body.get("group_name", "weight_update_group"), None) is None:
            return self._result(False, "The group to be destroyed does not exist.")
        return self._result(True, "Succeeded to destroy custom process group.")

    async def _update_weight_version(self, body: Any) -> web.Response:
        if self.refuse_version:
            return self._result(False, "Failed to update weight version: refused")
        self.version = body["new_version"]
        return self._result(
            True, f"Weight version updated to {self.version}", new_version=self.version
        )

    async def _abort_request(self, body: Any) -> web.Response:
        return web.Response(status=200)

    async def _release_memory_occupation(self, body: Any) -> web.Response:
        if self.fail_release:
            return web.json_response({"error": {"message": "already released"}}, status=400)
        self.released = True
        return web.json_response(None)

    async def _resume_memory_occupation(self, body: Any) -> web.Response:
        self.released = False
        return web.json_response(None)

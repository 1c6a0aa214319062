"""The policy step for one inference body, on the event loop or in a worker process.

`check_body` is pure (no I/O, no app state): rule 1, classification, rule 2, rules 3-9 and
the rewrite of a mask body. Small bodies are checked on the loop. Checking costs time in
proportion to the body (orjson parses 8 MiB of small values in ~70-150 ms) and to the prompts
of a mask batch (~12 us per item with per-item parameters), and orjson holds the GIL, so a
thread would not free the loop. Hence `BodyChecker` sends a body over `offload.min_bytes`, or
a mask request with more than `offload.min_items` prompts, to a small pool of worker
processes; the loop then only copies bytes. bench/gateway_policy_cost.py has the numbers.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import orjson

from maskgate.gateway.auth import check_mask_allowed
from maskgate.gateway.config import OffloadConfig
from maskgate.protocol import policy
from maskgate.protocol.engine_rules import ENGINE_MASK_CAP, Engine, check_engine
from maskgate.protocol.errors import ApiError
from maskgate.protocol.mask_format import FIELD as FORMAT_FIELD
from maskgate.protocol.mask_format import answer_formats

LOG = logging.getLogger("maskgate.offload")


@dataclass(frozen=True, slots=True)
class Checked:
    mask: bool  # a mask request (goes to the mask pool, or its error counts against it)
    raw: bytes  # the bytes to send upstream: the client's for general traffic
    error: ApiError | None = None
    # The body's `min_weight_version` (docs/rl.md), taken out: the gateway routes by it and
    # never sends it upstream. None when absent; validated by the proxy.
    min_version: Any = None
    # Mask requests: whether each answer wants packed masks (protocol/mask_format.py).
    packed: tuple[bool, ...] = (False,)


MIN_VERSION_FIELD = "min_weight_version"


@dataclass(slots=True)  # not frozen: built once per inference request, and frozen costs more
class BodyJob:
    """Everything `check_body` needs; picklable, so it can cross to a worker process."""

    route: policy.Route
    limit: int
    cfg: policy.PolicyConfig
    vocab_size: int | None
    rid: str
    key: str | None
    allow: frozenset[str] | None
    engine: Engine = "maskgate"  # the mask pool's engine (protocol/engine_rules.py)
    engine_cap: int = ENGINE_MASK_CAP  # its sampling_mask_max_tokens


def check_body(job: BodyJob, raw: bytes) -> Checked:
    """Rule 1 (raises), then for a mask request rules 2-9 and the rewrite (returned errors)."""
    body = policy.parse_body(raw, job.limit)
    if not policy.is_mask_request(job.route, body):
        return _general(body, raw)
    return _check_mask(job, body)


def _general(body: dict[str, Any], raw: bytes) -> Checked:
    """General traffic goes upstream as received, unless it named a minimum version."""
    if MIN_VERSION_FIELD not in body:
        return Checked(False, raw)
    wanted = body.pop(MIN_VERSION_FIELD)
    return Checked(False, orjson.dumps(body), min_version=wanted)


def _check_mask(job: BodyJob, body: dict[str, Any]) -> Checked:
    wanted = body.pop(MIN_VERSION_FIELD, None)
    try:
        check_mask_allowed(job.key, job.allow)  # rule 2
        out = policy.check_mask_request(job.route, body, job.cfg, vocab_size=job.vocab_size)
        check_engine(job.route, out, job.engine, job.engine_cap, "mask")
    except ApiError as e:
        return Checked(True, b"", e)
    packed = answer_formats(out, policy.batch_size(out))
    if job.engine == "sglang":
        out.pop(FORMAT_FIELD, None)  # SGLang answers lists; the gateway converts (relay)
    if job.route is policy.Route.GENERATE and "rid" not in out:
        out["rid"] = job.rid  # one string for a batch too: SGLang and the worker number items
    return Checked(True, orjson.dumps(out), min_version=wanted, packed=packed)


def prompt_count(route: policy.Route, body: dict[str, Any]) -> int:
    if route is policy.Route.GENERATE:
        return policy.batch_size(body) or 1
    prompt = body.get("prompt") if route is policy.Route.COMPLETIONS else None
    return len(prompt) if isinstance(prompt, list) else 1


class BodyChecker:
    """Runs `check_body` on the loop or in the worker pool (started on first use)."""

    def __init__(self, cfg: OffloadConfig, on_offload: Callable[[], None] | None = None) -> None:
        self.cfg = cfg
        self._pool: ProcessPoolExecutor | None = None
        self._on_offload = on_offload  # counts bodies checked in a worker process

    async def check(self, job: BodyJob, raw: bytes) -> Checked:
        cfg = self.cfg
        if cfg.min_bytes is not None and len(raw) > cfg.min_bytes:
            return await self._offload(job, raw)
        body = policy.parse_body(raw, job.limit)
        if not policy.is_mask_request(job.route, body):
            return _general(body, raw)
        if prompt_count(job.route, body) > cfg.min_items:
            return await self._offload(job, raw)
        return _check_mask(job, body)

    async def _offload(self, job: BodyJob, raw: bytes) -> Checked:
        pool = self._pool
        if pool is None:
            ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process
            pool = self._pool = ProcessPoolExecutor(self.cfg.workers, mp_context=ctx)
        if self._on_offload is not None:
            self._on_offload()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(pool, check_body, job, raw)
        except BrokenProcessPool:
            # A worker died (killed, out of memory): start a new pool next time and check
            # this body here, correct if slow.
            LOG.warning("policy worker pool broke; checking on the event loop")
            self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            return check_body(job, raw)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

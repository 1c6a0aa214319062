"""`/health` and `/health_generate`: is this worker fit to serve?

`/health` is cheap: 200 while the engine thread runs and its latest sampling step had finite
logits. After a step with non-finite logits (NaN or inf, for example from bad weights), it
runs the same probe as `/health_generate` and answers 503 until a step samples finite logits
again, so a worker recovers by itself once its weights are fixed (a weight update, or the
release of a hold).

`/health_generate` runs a real one-token greedy generation through the engine, as SGLang's
does, and answers 200 once it completes, 503 when it fails or does not complete within
`health_check_timeout_s`. While generation is paused or memory is released, no step can
run, and both answer 503 at once, saying why.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from maskgate.protocol.responses import json_response
from maskgate.worker.engine.batch import SamplingParams
from maskgate.worker.engine.sequence import Sequence, StopRule
from maskgate.worker.server.state import STATE, WorkerState

log = logging.getLogger("maskgate.worker")

PROBE_PROMPT = [0]  # one token id, present in every vocabulary
NONFINITE = "non-finite logits"
PROBE_POLL_S = 0.05  # how often a queued probe looks at the engine's progress


async def handle_health(request: web.Request) -> web.Response:
    state = request.app[STATE].get()
    if not state.engine.alive:
        return _unhealthy("engine stopped", "the engine thread is not running")
    if state.engine.nonfinite_logits:
        problem = await probe(state)
        if problem is not None:
            return _unhealthy(NONFINITE, problem)
    return json_response({"status": "ok", "role": state.config.role})


async def handle_health_generate(request: web.Request) -> web.Response:
    state = request.app[STATE].get()
    if not state.engine.alive:
        return _unhealthy("engine stopped", "the engine thread is not running")
    problem = await probe(state)
    if problem is not None:
        status = NONFINITE if state.engine.nonfinite_logits else "generation failed"
        return _unhealthy(status, problem)
    return json_response({"status": "ok", "role": state.config.role})


async def probe(state: WorkerState) -> str | None:
    """One greedy token through the engine; None when the worker is fit, else what went
    wrong. As SGLang's check, a busy engine that keeps stepping with finite logits passes
    before the probe's own turn comes: the probe then waits in the queue behind full slots."""
    engine = state.engine
    if engine.paused is not None:
        return f"generation is paused (mode {engine.paused}); no step can run"
    if engine.held:
        return f"memory is released ({', '.join(sorted(engine.held))}); no step can run"
    seq = Sequence(
        rid=f"HEALTH_CHECK_{time.time()}",
        prompt_ids=list(PROBE_PROMPT),
        params=SamplingParams(temperature=0.0),
        rule=StopRule(max_new_tokens=1, ignore_eos=True),
    )
    steps = engine.num_steps
    handle = engine.submit([seq])
    timeout = state.config.health_check_timeout_s
    try:
        async with asyncio.timeout(timeout):
            while True:
                ev = await handle.next_event(PROBE_POLL_S)
                if ev is None:
                    if engine.num_steps > steps + 1 and not engine.nonfinite_logits:
                        return None  # stepping on, finite: the probe's turn is not needed
                    continue
                if ev.error is not None:
                    return f"the probe failed: {ev.error.code}: {ev.error.message}"
                if ev.finished:
                    return None if ev.token is not None else f"the probe ended: {ev.finish_reason}"
    except TimeoutError:
        log.error("health probe: no token within %.1f s", timeout)
        return f"no token within {timeout:g} s"
    finally:
        handle.abort()


def _unhealthy(status: str, message: str) -> web.Response:
    return json_response({"status": status, "message": message}, status=503)

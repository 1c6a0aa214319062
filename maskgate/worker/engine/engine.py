"""The engine loop: one dedicated thread runs schedule -> runner.run -> postprocess, and hands
each step's results to the asyncio handlers without blocking the event loop.

Handlers submit a request (one or more sequences) and read `Event`s from the request's
asyncio queue. The engine thread never touches asyncio objects directly: it batches a step's
events into one `loop.call_soon_threadsafe` call. Requests and aborts reach the thread through
a thread-safe inbox; the thread blocks on it when there is nothing to run.

Control work (pausing, aborting by rid, copying new weights in, releasing memory) reaches the
thread through the same inbox as a callable (`between_steps`), so it runs after one step ends
and before the next begins: no forward ever sees a half-applied change. While `paused` (or
while memory is released, `held`) the thread takes no steps; new requests queue.

The overlap schedule (on unless `overlap=False`): the thread schedules and launches step
N + 1 before it collects and post-processes step N, so the device runs one step while the
host turns the previous one into events. Step N + 1 is scheduled without N's tokens (the
runner feeds them from the device, `batch.PENDING`); a sequence that step N finishes may
still have a row in N + 1, whose result is dropped, and none in N + 2. Control calls and
aborts first collect the step in flight: they always run with nothing in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from maskgate.protocol.errors import ApiError
from maskgate.worker.engine.batch import Launch, MaskIds, RowWork, Runner, StepStats
from maskgate.worker.engine.scheduler import Scheduler, StepOutcome
from maskgate.worker.engine.sequence import Sequence
from maskgate.worker.metrics import WorkerMetrics

log = logging.getLogger("maskgate.worker.engine.engine")

PauseMode = Literal["abort", "retract", "in_place"]


@dataclass(frozen=True, slots=True)
class Event:
    """What one step did to one sequence (a snapshot, safe to read on the event loop)."""

    index: int  # the sequence's index within its request
    token: int | None = None  # committed output token, None when the step committed none
    logprob: float | None = None  # mask rows only
    mask: MaskIds | None = None  # mask rows only
    truncated: bool = False
    raw_logprob: float | None = None  # want_logprob rows only (raw distribution)
    top: list[tuple[float, int]] | None = None  # top_logprobs > 0 only
    # The prompt's log-probs, on the events up to the first output token (a snapshot: the
    # receiver replaces, never extends); None when not asked.
    input_logprobs: list[float] | None = None
    input_top: list[list[tuple[float, int]]] | None = None
    ids_logprobs: list[float] | None = None  # logprob_ids only: theirs at `token`
    input_ids_logprobs: list[list[float]] | None = None  # likewise for the prompt (a snapshot)
    finish_reason: str | None = None  # set on the sequence's last event
    matched_stop: int | str | None = None
    text_limit: int | None = None
    error: ApiError | None = None
    weight_version: str | None = None  # the weights live at this event (sampled `token`)
    abort_message: str | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestHandle:
    """The handler's side of one request: its sequences' events, in order."""

    def __init__(self, engine: Engine, seqs: list[Sequence]) -> None:
        self.engine = engine
        self.seqs = seqs  # owned by the engine thread once submitted; do not read from here
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.num_open = len(seqs)

    async def next_event(self, timeout: float) -> Event | None:
        """The next event, or None after `timeout` seconds without one (the caller then
        checks whether its client is still there)."""
        if self.queue.empty():
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that races with the result, and events arrive every step, so a
            # disconnected client's cancellation would often be lost.
            try:
                async with asyncio.timeout(timeout):
                    ev = await self.queue.get()
            except TimeoutError:
                return None
        else:
            ev = self.queue.get_nowait()
        if ev.finished:
            self.num_open -= 1
        return ev

    def abort(self) -> None:
        if self.num_open:
            self.engine.abort(self)


class Engine:
    def __init__(
        self,
        runner: Runner,
        scheduler: Scheduler,
        metrics: WorkerMetrics,
        *,
        overlap: bool = True,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.metrics = metrics
        self.overlap = overlap
        # The step launched and not yet collected (overlap only): its rows and its handle.
        self._in_flight: tuple[list[tuple[Sequence, RowWork]], Launch] | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._owner: dict[int, tuple[RequestHandle, int]] = {}  # id(seq) -> (handle, index)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.num_steps = 0
        # Engine-thread state, changed only by callables run through `between_steps`.
        self.weight_version = "default"
        self.paused: PauseMode | None = None
        self.held: set[str] = set()  # released memory tags (maskgate/worker/runner/memory.py)
        # The latest step that sampled had a row with non-finite logits: /health answers 503
        # until a later step samples finite rows only (read on the event loop; a bool).
        self.nonfinite_logits = False

    # --- event-loop side -------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="maskgate-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._inbox.put(("stop", None))
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None

    def submit(self, seqs: list[Sequence]) -> RequestHandle:
        handle = RequestHandle(self, seqs)
        self._inbox.put(("add", handle))
        return handle

    def abort(self, handle: RequestHandle) -> None:
        self._inbox.put(("abort", handle))

    def between_steps(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run `fn` on the engine thread once the current step ends; its result (or
        exception) comes back through the future (await it with asyncio.wrap_future)."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._inbox.put(("call", (fn, fut)))
        return fut

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._drain_inbox(block=not self._can_step() and self._in_flight is None):
                if self._can_step():
                    self.step()
                else:
                    self.finish_step()
            self.finish_step()
            err = ApiError("worker_shutting_down", "the worker is stopping", status=503)
        except Exception:
            log.exception("engine loop crashed")
            err = ApiError("worker_error", "the engine loop failed", status=500)
        self._fail_all(err)
        while True:  # control calls still queued: answer them rather than leave them waiting
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "call" and item[1].set_running_or_notify_cancel():
                item[1].set_exception(err)

    def _drain_inbox(self, *, block: bool) -> bool:
        """Apply queued adds and aborts. False when asked to stop."""
        while True:
            try:
                kind, handle = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if kind == "stop":
                return False
            assert handle is not None
            if kind != "add":
                self.finish_step()  # control and aborts never run with a step in flight
            if kind == "call":
                fn, fut = handle
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as e:  # handed to the caller, never lost
                        fut.set_exception(e)
            elif kind == "add":
                self._add(handle)
            else:
                self._abort(handle)

    def _add(self, handle: RequestHandle) -> None:
        events: list[tuple[RequestHandle, Event]] = []
        for i, seq in enumerate(handle.seqs):
            self._owner[id(seq)] = (handle, i)
            self.scheduler.add(seq)
            if seq.is_finished:  # max_new_tokens=0
                events.append(self._event(seq))
        self._publish(events)
        self._update_gauges()

    def _abort(self, handle: RequestHandle) -> None:
        events = [self._event(s) for s in handle.seqs if self.scheduler.abort(s)]
        self._publish(events)
        self._update_gauges()

    def _can_step(self) -> bool:
        return self.scheduler.has_work() and self.paused is None and not self.held

    # --- control (engine thread: call these through between_steps) -------------------------

    def abort_where(self, match: Callable[[Sequence], bool], message: str) -> int:
        """Abort every queued or running sequence `match` accepts; how many were aborted."""
        seqs = [s for s in (*self.scheduler.waiting, *self.scheduler.running) if match(s)]
        events = [self._event(s) for s in seqs if self.scheduler.abort(s, message)]
        self._publish(events)
        self._update_gauges()
        return len(events)

    def pause(self, mode: PauseMode) -> int:
        """Stop stepping. abort: end every request; retract: running sequences go back to
        the queue (their KV freed, recomputed on continue); in_place: keep everything.
        Returns the number of sequences aborted or retracted."""
        self.paused = mode
        if mode == "abort":
            return self.abort_where(lambda _s: True, "aborted by /pause_generation")
        if mode == "retract":
            n = self.scheduler.retract_all()
            self._update_gauges()
            return n
        return 0

    def resume(self) -> None:
        self.paused = None

    def step(self) -> None:
        """Schedule and launch one step; collect it now, or (overlap) the one before it."""
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch:
            self.finish_step()
            return
        try:
            launched = self.runner.launch([row for _, row in batch])
        except Exception:
            self.finish_step()
            self._step_failed(batch)
            return
        previous, self._in_flight = self._in_flight, (batch, launched)
        if previous is not None:
            self._complete(*previous)
        if not self.overlap:
            self.finish_step()
        self.metrics.step_seconds.observe(time.perf_counter() - t0)

    def finish_step(self) -> None:
        """Collect and post-process the step in flight, if any."""
        if self._in_flight is not None:
            batch, launched = self._in_flight
            self._in_flight = None
            self._complete(batch, launched)

    def _complete(self, batch: list[tuple[Sequence, RowWork]], launched: Launch) -> None:
        try:
            results, stats = launched.collect()
        except Exception:
            self._step_failed(batch)
            return
        outcome = self.scheduler.postprocess(batch, results)
        self.num_steps += 1
        sampled = [
            res.nan for (_, row), res in zip(batch, results, strict=True) if row.sample and res
        ]
        if sampled and any(sampled) != self.nonfinite_logits:
            self.nonfinite_logits = any(sampled)
            log.warning("non-finite logits: %s", "unhealthy" if any(sampled) else "recovered")
        self._observe(outcome, len(batch), stats, any(r.want_mask for _, r in batch))
        self._publish([self._event(seq) for seq in outcome.updated])

    def _step_failed(self, batch: list[tuple[Sequence, RowWork]]) -> None:
        log.exception("model runner step failed; failing the step's requests")
        err = ApiError("worker_error", "the model runner failed", status=500)
        self.scheduler.abandon(batch)
        self.scheduler.flush_cache()  # what the failed step left in the KV is unknown
        self._publish([self._fail(seq, err) for seq, _ in batch if not seq.is_finished])

    def _fail(self, seq: Sequence, err: ApiError) -> tuple[RequestHandle, Event]:
        self.scheduler.abort(seq)
        seq.error = err
        seq.finish_reason = "error"
        return self._event(seq)

    def _fail_all(self, err: ApiError) -> None:
        seqs = [*self.scheduler.waiting, *self.scheduler.running]
        self._publish([self._fail(seq, err) for seq in seqs])

    def _event(self, seq: Sequence) -> tuple[RequestHandle, Event]:
        handle, index = self._owner[id(seq)]
        committed = seq.error is None and seq.finish_reason != "abort" and seq.output_ids
        raw = committed and seq.want_logprob
        prompt = seq.logprob_start >= 0 and len(seq.output_ids) <= 1
        ev = Event(
            index=index,
            token=seq.output_ids[-1] if committed else None,
            logprob=seq.logprobs[-1] if committed and seq.want_mask else None,
            mask=seq.masks[-1] if committed and seq.want_mask else None,
            truncated=bool(committed and seq.want_mask and seq.truncated[-1]),
            raw_logprob=seq.raw_logprobs[-1] if raw else None,
            top=seq.top[-1] if raw and seq.top_logprobs > 0 else None,
            input_logprobs=list(seq.input_logprobs) if prompt else None,
            input_top=list(seq.input_top) if prompt and seq.top_logprobs > 0 else None,
            ids_logprobs=seq.ids_logprobs[-1] if raw and seq.logprob_ids else None,
            input_ids_logprobs=list(seq.input_ids_logprobs) if prompt and seq.logprob_ids else None,
            finish_reason=seq.finish_reason,
            matched_stop=seq.matched_stop,
            text_limit=seq.text_limit,
            error=seq.error,
            weight_version=self.weight_version,
            abort_message=seq.abort_message,
            cached_tokens=seq.num_cached,
        )
        if seq.is_finished:
            del self._owner[id(seq)]
        return handle, ev

    def _publish(self, events: list[tuple[RequestHandle, Event]]) -> None:
        if events and self._loop is not None:
            self._loop.call_soon_threadsafe(_deliver, events)

    def _observe(self, out: StepOutcome, rows: int, stats: StepStats, masks: bool) -> None:
        m = self.metrics
        m.batch_size.observe(rows)
        m.generated_tokens.inc(out.num_generated)
        m.prompt_tokens.inc(out.num_prompt_tokens)
        for t in out.ttft:
            m.ttft.observe(t)
        for t in out.itl:
            m.itl.observe(t)
        m.device_wait_seconds.observe(stats.device_wait_seconds)
        if masks:
            m.mask_kernel_seconds.observe(stats.mask_seconds)
        if stats.num_fallback_rows:
            m.sampler_fallback_rows.inc(stats.num_fallback_rows)
        overflows = sum(
            1
            for s in out.updated
            if s.error is not None and s.error.code == "sampling_mask_overflow"
        )
        if overflows:
            m.mask_overflows.inc(overflows)
        self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.waiting.set(self.scheduler.num_waiting)
        self.metrics.running.set(self.scheduler.num_running)
        self.metrics.kv_usage.set(self.scheduler.kv_usage)


def freeze_heap() -> None:
    """Collect once, then move every object alive now (the model, the tokenizer, the modules
    of torch and the other libraries) to the collector's permanent generation. A full
    collection while serving then walks only what requests created, not the hundreds of
    thousands of objects a loaded worker holds, so it no longer stalls a step for the time of
    that walk (SGLang freezes its scheduler's heap the same way). Called once the worker is
    ready, before its first step; docs/worker.md, "Garbage collection"."""
    gc.collect()
    gc.freeze()


def _deliver(events: list[tuple[RequestHandle, Event]]) -> None:
    for handle, ev in events:
        handle.queue.put_nowait(ev)

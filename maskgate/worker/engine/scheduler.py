"""Continuous batching over KV slots, torch-free.

Each step the scheduler builds one batch of `RowWork`: a decode row (one token) for every
running sequence whose prompt is in the cache, then prompt chunks for sequences still
prefilling, then newly admitted sequences, while the step's prefill budget lasts. A sequence
is admitted when fewer than `max_num_seqs` run and a KV slot is free or cached (the least
recently used cached one is evicted); otherwise it waits in FIFO order. A slot holds a whole
sequence (prompt + output <= max_model_len), so admission is the only capacity decision:
nothing is preempted for capacity. `retract_all` (pause mode `retract`) is the one way back
to the queue. With `prefix_cache`, a prompt's longest cached prefix is copied into its slot
instead of computed (maskgate/worker/engine/prefix_cache.py).

`schedule` may run before the previous step's results are back (the engine's overlap
schedule): prompt progress counts when a chunk is scheduled, and a sequence whose newest
token is still in flight feeds `PENDING`.

`postprocess` commits the sampled tokens, applies the finish rules (EOS, stop token ids, stop
strings, max_new_tokens, max_model_len) and turns overflow / NaN results into request errors.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from maskgate.protocol.errors import ApiError
from maskgate.worker.engine.batch import PENDING, RowResult, RowWork, Runner
from maskgate.worker.engine.prefix_cache import PrefixCache
from maskgate.worker.engine.sequence import SeqStatus, Sequence

OVERFLOW = 1  # RowResult.mask_status values (maskgate/worker/engine/batch.py)
TRUNCATED = 2
# A prefilling sequence waits a step for an earlier one that is about to write a prefix they
# share (n > 1, a group of one prompt) when the wait saves at least this many tokens, or half
# of what it has left: a shared first token or two is not worth a step of latency.
MIN_WAIT_TOKENS = 32


@dataclass(slots=True)
class StepOutcome:
    """What one step changed, for the engine's events and metrics."""

    updated: list[Sequence] = field(default_factory=list)  # got a token or finished
    ttft: list[float] = field(default_factory=list)  # seconds, arrival -> first token
    itl: list[float] = field(default_factory=list)  # seconds between consecutive tokens
    num_generated: int = 0
    num_prompt_tokens: int = 0  # prompt tokens prefilled this step


class Scheduler:
    def __init__(
        self,
        runner: Runner,
        *,
        max_num_seqs: int,
        max_prefill_tokens: int,
        max_mask_tokens: int,
        decode: Callable[[list[int]], str] | None = None,
        prefix_cache: bool = False,
    ) -> None:
        if max_num_seqs < 1 or max_prefill_tokens < 1:
            raise ValueError("max_num_seqs and max_prefill_tokens must be >= 1")
        self.runner = runner
        self.max_num_seqs = min(max_num_seqs, runner.max_num_slots)
        self.max_prefill_tokens = max_prefill_tokens
        self.max_model_len = runner.max_model_len
        self.max_mask_tokens = max_mask_tokens
        self.eos_token_ids = runner.eos_token_ids
        self.decode = decode  # output ids -> text; needed only for stop strings
        # Slot bookkeeping, and with prefix_cache the radix tree of what the slots hold.
        self.cache = PrefixCache(runner.max_num_slots)
        self.caching = prefix_cache
        self.owner: dict[int, Sequence] = {}  # slot -> the running sequence holding it
        self.num_admitted = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def free_slots(self) -> deque[int]:
        """Slots that hold nothing (cached slots are not counted: they are taken last)."""
        return self.cache.free

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV slots held by running sequences."""
        return len(self.running) / self.runner.max_num_slots

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        # The API layer rejects prompts that do not fit; this is an internal invariant.
        assert 0 < seq.num_prompt_tokens < self.max_model_len, "prompt must fit one KV slot"
        if seq.rule.max_new_tokens == 0 and not seq.logprob_start >= 0:
            seq.finish("length")
            return
        self.waiting.append(seq)

    def abort(self, seq: Sequence, message: str | None = None) -> bool:
        """Stop `seq` now, wherever it is. False when it had already finished."""
        if seq.is_finished:
            return False
        if seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.abort_message = message
        seq.finish("abort")
        self._retire(seq)
        return True

    def retract_all(self) -> int:
        """Send every running sequence back to the head of the queue, in order, freeing its
        KV slot; readmitted, it prefills prompt + output so far and goes on where it was."""
        retracted = list(self.running)
        for seq in retracted:
            self._retire(seq)
            seq.status = SeqStatus.WAITING
            seq.recompute_ids = seq.prompt_ids + seq.output_ids if seq.output_ids else None
            seq.num_prefilled = seq.num_cached = 0
            seq.decode_row = seq.spare_row = None
            seq.num_retractions += 1
        self.waiting.extendleft(reversed(retracted))
        return len(retracted)

    def schedule(self) -> list[tuple[Sequence, RowWork]]:
        """The next step's rows: decodes first (latency), then prompt chunks within budget."""
        batch: list[tuple[Sequence, RowWork]] = []
        for seq in self.running:
            if not seq.is_prefilling and (row := self._decode_row(seq)) is not None:
                batch.append((seq, row))
        budget = self.max_prefill_tokens
        copies: list[tuple[int, int, int, int]] = []
        for seq in self.running:
            if seq.is_prefilling and budget > 0 and not self._reuse(seq, copies):
                budget -= self._add_prefill(batch, seq, budget)
        while self.waiting and budget > 0 and self.can_admit():
            seq = self.waiting.popleft()
            self.admit(seq)
            if not self._reuse(seq, copies):
                budget -= self._add_prefill(batch, seq, budget)
        if copies:  # queued ahead of the step's forward, in order
            self.runner.copy_kv(copies)
        for seq, row in batch:
            seq.num_in_flight += 1
            if row.start_pos < seq.num_prefilled:  # a prompt chunk: copies may read it next
                self.cache.set_written(row.slot, seq.num_prefilled)
        return batch

    def _add_prefill(
        self, batch: list[tuple[Sequence, RowWork]], seq: Sequence, budget: int
    ) -> int:
        """The sequence's next prompt chunk; its progress counts from now (a later step, even
        one scheduled before this one's results are back, goes on after it)."""
        row = self._prefill_row(seq, budget)
        seq.num_prefilled += len(row.token_ids)
        batch.append((seq, row))
        return len(row.token_ids)

    def can_admit(self) -> bool:
        # Every slot no sequence holds is free or cached (evictable). A finished sequence
        # holds its slot while a step launched before it finished still writes there.
        return len(self.running) < self.max_num_seqs and len(self.owner) < self.runner.max_num_slots

    def admit(self, seq: Sequence) -> None:
        slot = None
        if self.caching:
            # The cached slot holding the longest prefix of the prompt: taken over whole, it
            # needs no copy (and is not lost to an eviction that a copy would have to race).
            m = self.cache.match(seq.prefill_ids, _reuse_limit(seq), -1)
            if m.slot is not None and m.slot in self.cache.cached:
                slot = m.slot
                self.cache.take_over(slot, seq.prefill_ids, m.length)
                seq.num_prefilled = m.length
                seq.num_cached = min(m.length, seq.num_prompt_tokens)
        if slot is None:
            slot = self.cache.take()
            if self.caching:
                self.cache.claim(slot, seq.prefill_ids)
        seq.slot = slot
        seq.status = SeqStatus.RUNNING
        seq.admit_order = self.num_admitted
        self.num_admitted += 1
        self.owner[slot] = seq
        self.running.append(seq)

    def flush_cache(self) -> None:
        """Forget every cached prefix (new weights, or the KV memory released); running
        sequences keep their slots, which are freed rather than cached when they end."""
        self.cache.flush(list(self.owner))

    def postprocess(
        self, batch: list[tuple[Sequence, RowWork]], results: list[RowResult | None]
    ) -> StepOutcome:
        assert len(batch) == len(results), "runner must answer every row"
        now = time.monotonic()
        out = StepOutcome()
        for (seq, row), res in zip(batch, results, strict=True):
            seq.num_in_flight -= 1
            if seq.is_finished:  # finished at an earlier step: this row's result is dropped
                if seq.num_in_flight == 0 and seq.slot is not None:
                    self._release(seq, nan=res is not None and res.nan)
                continue
            if row.start_pos < len(seq.prefill_ids):  # a prompt chunk
                out.num_prompt_tokens += len(row.token_ids)
                if res is not None and res.prompt_logprobs is not None:
                    seq.input_logprobs.extend(res.prompt_logprobs)
                    seq.input_top.extend(res.prompt_top or ())
                    seq.input_ids_logprobs.extend(res.prompt_ids_logprobs or ())
            if not row.sample:
                continue
            assert res is not None, "a sampling row needs a result"
            if res.nan:
                seq.fail(numerical_error())
            elif res.mask_status == OVERFLOW:
                seq.fail(overflow_error(res.support_size, self.max_mask_tokens, row.step))
            elif seq.rule.max_new_tokens == 0:  # a prompt scored for its log-probs only
                seq.finish("length")
            else:
                self._commit(seq, res, now, out)
            out.updated.append(seq)
            if seq.is_finished:
                self._retire(seq)
        return out

    # --- internals ------------------------------------------------------------------------

    def _reuse(self, seq: Sequence, copies: list[tuple[int, int, int, int]]) -> bool:
        """Copy the longest cached prefix of what `seq` still has to prefill into its slot
        (a `copies` entry: source slot, its slot, positions [start, end)). True when it should
        rather wait a step for an earlier sequence that is writing a longer shared prefix."""
        if not self.caching:
            return False
        ids, slot, done = seq.prefill_ids, _slot(seq), seq.num_prefilled
        limit = _reuse_limit(seq)
        if limit <= done:
            return False
        m = self.cache.match(ids, limit, slot)
        if m.length > done and m.slot is not None:
            copies.append((m.slot, slot, done, m.length))
            seq.num_cached += max(0, min(m.length, seq.num_prompt_tokens) - done)
            seq.num_prefilled = done = m.length
            self.cache.set_written(slot, done)
            self.cache.touch(m.slot)
        # A running slot holds fewer tokens written than claimed only while its prefill is
        # still to be written (or was just scheduled): its sequence is about to write them.
        leader = self.owner.get(m.pending_slot) if m.pending_slot is not None else None
        return (
            leader is not None
            and leader.admit_order < seq.admit_order
            and not leader.is_finished
            and m.pending - done >= max(1, min(MIN_WAIT_TOKENS, (limit - done + 1) // 2))
        )

    def abandon(self, batch: list[tuple[Sequence, RowWork]]) -> None:
        """A step that failed or was dropped: its rows are no longer in flight."""
        for seq, _ in batch:
            seq.num_in_flight -= 1
            if seq.is_finished and seq.num_in_flight == 0 and seq.slot is not None:
                self._release(seq, nan=True)  # what the step wrote is unknown

    def _decode_row(self, seq: Sequence) -> RowWork | None:
        """None when the token in flight is sure to end the sequence (a length limit)."""
        n = len(seq.output_ids)
        # With a step in flight (the overlap schedule), the sequence's newest token is not
        # back yet: the row feeds PENDING, which the runner replaces on the device with the
        # token the slot's row of the previous step sampled.
        pending = 1 if seq.num_in_flight else 0
        if pending and (
            n + 1 >= seq.rule.max_new_tokens or seq.num_prompt_tokens + n + 1 >= self.max_model_len
        ):
            return None
        # Two RowWorks per sequence, reused in turn: building a fresh one per row per step
        # was the scheduler's largest cost at batch 128, and the step in flight still holds
        # the other one.
        row = seq.decode_row
        if row is None:
            row = RowWork(
                slot=_slot(seq),
                token_ids=[],
                start_pos=0,
                sample=True,
                params=seq.params,
                want_mask=seq.want_mask,
                bounded=seq.bounded,
                want_logprob=seq.want_logprob,
                top_logprobs=seq.top_logprobs,
                logprob_ids=seq.logprob_ids,
            )
        seq.decode_row, seq.spare_row = seq.spare_row, row
        row.token_ids = [PENDING] if pending else [seq.output_ids[-1]]
        row.start_pos = len(seq.prompt_ids) + n + pending - 1
        row.step = n + pending
        return row

    def _prefill_row(self, seq: Sequence, budget: int) -> RowWork:
        ids = seq.prefill_ids
        start = seq.num_prefilled
        end = min(len(ids), start + budget)
        last = end == len(ids)
        row = RowWork(
            slot=_slot(seq),
            token_ids=ids[start:end],
            start_pos=start,
            sample=last,
            params=seq.params,
            want_mask=seq.want_mask and last,
            bounded=seq.bounded,
            step=len(seq.output_ids),  # > 0 for a retracted sequence's recompute
            want_logprob=seq.want_logprob and last,
            top_logprobs=seq.top_logprobs,
            logprob_ids=seq.logprob_ids,
        )
        if seq.logprob_start >= 0:
            # Logits at position p score prompt token p + 1, for p from logprob_start on; the
            # last prompt position scores the first output token instead. A sequence that was
            # retracted prefills again: positions it scored before are not scored twice.
            lo = max(start, seq.logprob_start + len(seq.input_logprobs))
            hi = min(end, seq.num_prompt_tokens - 1)
            if lo < hi:
                row.prompt_from = lo - start
                row.prompt_targets = seq.prompt_ids[lo + 1 : hi + 1]
        return row

    def _commit(self, seq: Sequence, res: RowResult, now: float, out: StepOutcome) -> None:
        if seq.last_token_time is None:
            seq.first_token_time = now
            out.ttft.append(now - seq.arrival)
        else:
            out.itl.append(now - seq.last_token_time)
        seq.last_token_time = now
        seq.output_ids.append(res.token)
        out.num_generated += 1
        if seq.want_logprob:
            assert res.raw_logprob is not None, "a log-prob row needs its log-prob"
            seq.raw_logprobs.append(res.raw_logprob)
            if seq.top_logprobs > 0:
                seq.top.append(res.top or [])
            if seq.logprob_ids:
                seq.ids_logprobs.append(res.ids_logprobs or [])
        if seq.want_mask:
            assert res.mask is not None, "a mask row needs a mask"
            seq.logprobs.append(res.logprob)
            seq.masks.append(res.mask)
            seq.truncated.append(res.mask_status == TRUNCATED)
        self._check_finish(seq, res.token)

    def _check_finish(self, seq: Sequence, token: int) -> None:
        rule = seq.rule
        is_eos = not rule.ignore_eos and token in self.eos_token_ids
        if is_eos or token in rule.stop_token_ids:
            seq.finish("stop", token)
        elif rule.stop and self._match_stop(seq):
            pass
        elif seq.num_output_tokens >= rule.max_new_tokens:
            seq.finish("length")
        elif seq.num_prompt_tokens + seq.num_output_tokens >= self.max_model_len:
            seq.finish("length")  # the slot is full

    def _match_stop(self, seq: Sequence) -> bool:
        assert self.decode is not None, "stop strings need a decode function"
        longest = max(len(s) for s in seq.rule.stop)
        # Cheap test on the decoded tail, so a long output is not decoded whole every step.
        # A new match ends in the newest token and spans at most `longest` characters; a
        # character takes at most 4 byte-level tokens, plus a few that decode to nothing.
        tail = self.decode(seq.output_ids[-(4 * longest + 8) :])
        if not any(s in tail for s in seq.rule.stop):
            return False
        text = self.decode(seq.output_ids)
        hits = [(i, s) for s in seq.rule.stop if (i := text.find(s)) >= 0]
        if not hits:
            return False
        pos, stop = min(hits)
        seq.text_limit = pos
        seq.finish("stop", stop)
        return True

    def _retire(self, seq: Sequence) -> None:
        if seq.slot is None:
            return
        self.running.remove(seq)
        if seq.num_in_flight == 0:  # else: released when the step in flight comes back
            self._release(seq)

    def _release(self, seq: Sequence, nan: bool = False) -> None:
        slot = _slot(seq)
        del self.owner[slot]
        self.runner.release(slot)
        # What the slot holds: the fed tokens. A decoding sequence's newest token is not fed.
        n = seq.num_prefilled
        if not seq.is_prefilling and seq.output_ids:
            n = seq.num_prompt_tokens + seq.num_output_tokens - 1
        if self.caching and seq.error is None and not nan:
            self.cache.set_written(slot, n)
            self.cache.retire(slot, seq.prompt_ids + seq.output_ids, keep=True)
        else:
            self.cache.retire(slot, [], keep=False)
        seq.slot = None


def _reuse_limit(seq: Sequence) -> int:
    """How much of its prefill a sequence may take from the cache: the last token is always
    fed (its logits sample the next token), and so is every position whose logits score a
    prompt token."""
    limit = len(seq.prefill_ids) - 1
    if seq.logprob_start >= 0:
        limit = min(limit, seq.logprob_start + len(seq.input_logprobs))
    return limit


def _slot(seq: Sequence) -> int:
    assert seq.slot is not None, "a running sequence holds a slot"
    return seq.slot


def overflow_error(support_size: int, cap: int, step: int) -> ApiError:
    return ApiError(
        "sampling_mask_overflow",
        f"the sampling mask of output token {step} has |S|={support_size} tokens, more than "
        f"the worker's cap C={cap} (max_mask_tokens). Lower top_p, raise min_p or set "
        f"top_k <= {cap}, or send sampling_mask_mode='bounded' to receive the first {cap} "
        "ids with the step flagged in output_token_sampling_mask_truncated.",
        status=400,
        param="top_p",
    )


def numerical_error() -> ApiError:
    return ApiError(
        "worker_numerical_error",
        "the model produced NaN logits for this request; no token was sampled",
        status=500,
        error_type="server_error",
    )

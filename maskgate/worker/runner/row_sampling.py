"""The sampler call of a step: per-row parameters to device tensors, `kernels.sample` (or the
sort-all baseline, same signature), and its outputs back to per-row `RowResult`s.

The runner's forward is still running on the GPU when the sampler is called, so nothing here
waits on the device before `kernels.sample` is launched: the parameters go over in one
asynchronous copy from pinned memory, and the host's only waits are the copies back of the
results.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np
import torch

from maskgate import kernels
from maskgate.kernels import STATUS_OVERFLOW
from maskgate.worker.engine.batch import RowResult, RowWork
from maskgate.worker.runner.mask_copy import MaskIdsCopy
from maskgate.worker.runner.raw_logprobs import ids_logprobs, token_logprobs

SampleFn = Callable[..., Any]  # kernels.sample or kernels.sample_sort_all_rows


# Batch sizes whose every sampler variant (seeded, unseeded, with and without masks) is
# compiled at start: Triton specialises integer arguments equal to 1 or divisible by 16.
SMALL_BATCHES = (1, 2, 16)
# The runner's logits dtype (LlamaForCausalLM.compute_logits): pass 1's config depends on it.
LOGITS_DTYPE = torch.float32
# The per-row fields of RowSampler's parameter buffer, in buffer order, with the dtypes
# kernels.sample takes. Each starts at a multiple of ALIGN bytes: Triton compiles a separate
# kernel variant for pointers that are not 16-byte aligned.
_FIELDS = (
    ("seed", torch.int64),
    ("step", torch.int64),
    ("temperature", torch.float32),
    ("top_p", torch.float32),
    ("min_p", torch.float32),
    ("top_k", torch.int32),
    ("bounded", torch.bool),
    ("want_mask", torch.bool),  # last: the sampler reads it on the host (it sizes outputs)
)
_NUMPY = {
    torch.int64: np.int64,
    torch.float32: np.float32,
    torch.int32: np.int32,
    torch.bool: np.bool_,
}
ALIGN = 16
INT32_MAX = 2**31 - 1


@torch.inference_mode()
def warm_up_sampler(
    sample_fn: SampleFn,
    vocab_size: int,
    device: torch.device,
    max_mask_tokens: int,
    max_batch: int,
) -> None:
    """Compile the sampler's Triton variants before traffic arrives; compiled mid-traffic, a
    variant stalls every stream of the worker for seconds.

    Calls are keyed (seed and step given) as RowSampler's always are, so the sampler's
    unseeded variant is never compiled. SMALL_BATCHES run sample_fn with and without masks.
    Then `kernels.sample` (the baseline sends its mask-free batches there too) runs twice at
    each size of `warm_up_batches(vocab_size, max_batch)`, every row asking for a mask and no
    row asking: its pass 1 has a config per batch range, compiled with the race of rows
    nothing truncates only for launches with a row that asks for no mask (a general pool's
    batches), and its resolve kernel specialises on that config's chunk count.
    """
    for b in SMALL_BATCHES:
        for want in (True, False):
            _warm_call(sample_fn, b, vocab_size, device, max_mask_tokens, want)
    covered = SMALL_BATCHES if sample_fn is kernels.sample else ()
    for b in warm_up_batches(vocab_size, max_batch):
        if b not in covered:
            for want in (True, False):
                _warm_call(kernels.sample, b, vocab_size, device, max_mask_tokens, want)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up_batches(vocab_size: int, max_batch: int) -> list[int]:
    """Batch sizes that meet every compiled variant of kernels.sample's CUDA path for batches of
    1..max_batch rows, all rows asking for masks (ascending, few: one per compile key and
    max_batch).

    Pass 1's config (`default_config(vocab, B)`) is what varies with the batch (a handful of
    configs, in power-of-two steps of B), and the resolve kernel with it. The smallest B of
    each config meets it. Nothing
    else specialises on the batch: resolve takes its mask-packing mode at run time and the
    emit kernel, which only batches past one row an SM launch, compiles once. max_batch runs
    too, so the largest launch and its buffers are ready before traffic.
    """
    from maskgate.kernels import default_config

    batches = {max_batch}
    seen = set()
    for b in range(1, max_batch + 1):
        key = default_config(vocab_size, b)
        if key not in seen:
            seen.add(key)
            batches.add(b)
    return sorted(batches)


def _warm_call(
    sample_fn: SampleFn,
    b: int,
    vocab_size: int,
    device: torch.device,
    max_mask_tokens: int,
    want: bool,
) -> None:
    """One keyed sampler call over [b, vocab_size] random logits of the runner's dtype."""
    logits = torch.randn(b, vocab_size, device=device, dtype=LOGITS_DTYPE)
    rows = torch.ones(b, device=device)
    ids = torch.arange(b, device=device, dtype=torch.int64)
    sample_fn(
        logits,
        rows.clone(),
        torch.full((b,), 50, device=device, dtype=torch.int32),
        rows * 0.9,
        rows * 0.0,
        torch.full((b,), want, dtype=torch.bool),
        max_mask_tokens=max_mask_tokens,
        seed=ids,
        step=ids.clone(),
        bounded=torch.zeros(b, device=device, dtype=torch.bool),
    )


class RowSampler:
    """The sampler call of a step, with the parameter buffers it reuses from step to step.

    All per-row parameters of a step go to the device in one copy: the fields share one byte
    buffer (pinned on CUDA, so the copy is asynchronous and the host does not wait for the
    forward still running on the GPU), and the sampler's arguments are typed views of its
    device twin, each starting at a multiple of ALIGN bytes whatever the batch.
    """

    def __init__(self, sample_fn: SampleFn, device: torch.device, max_mask_tokens: int) -> None:
        self.sample_fn = sample_fn
        self.device = device
        self.max_mask_tokens = max_mask_tokens
        self.cuda = device.type == "cuda"
        self.capacity = 0  # rows the buffers hold; grown on demand
        self.host_fields: dict[str, np.ndarray] = {}  # name -> view of host_buf, [capacity]
        # name -> view of device_buf, [capacity] (want_mask: of host_buf)
        self.fields: dict[str, torch.Tensor] = {}
        self.views: dict[int, dict[str, torch.Tensor]] = {}  # B -> fields cut to [B]
        # The last parameter copy: the host buffer is rewritten only once it has completed.
        self.copied = torch.cuda.Event() if self.cuda else None
        self.mask_ids = MaskIdsCopy(device)  # the step's mask ids to the host

    def sample(
        self, logits: torch.Tensor, rows: list[RowWork]
    ) -> tuple[list[RowResult], float, int]:
        """kernels.sample over logits [B, V], row i of logits being rows[i]; returns per-row
        results, the sampler's seconds (device time on CUDA) and the number of rows that
        needed the sampler's slow full pass."""
        return self.launch(logits, rows).collect()

    def launch(self, logits: torch.Tensor, rows: list[RowWork]) -> SampledRows:
        """`sample` without waiting: the sampler and the copies of its results to the host
        are queued; `collect()` on what this returns waits for them."""
        b = len(rows)
        self._fill(rows)
        f = self.views.get(b)
        if f is None:
            f = self.views[b] = {name: t[:b] for name, t in self.fields.items()}
        timer = _Timer(self.device)
        res = self.sample_fn(
            logits,
            f["temperature"],
            f["top_k"],
            f["top_p"],
            f["min_p"],
            f["want_mask"],
            max_mask_tokens=self.max_mask_tokens,
            seed=f["seed"],
            step=f["step"],
            bounded=f["bounded"],
        )
        timer.mark()
        raw = self._raw_logprobs(logits, rows, f["temperature"], res)
        return SampledRows(res, rows, raw, timer, self.mask_ids)

    def _raw_logprobs(
        self,
        logits: torch.Tensor,
        rows: list[RowWork],
        temperature: torch.Tensor,
        res: Any,
    ) -> tuple[list[int], int, torch.Tensor] | None:
        """The raw log-probs of the rows that asked (None when none did): their batch
        indices, the top count computed (the largest asked, cut at the vocabulary) and one
        block [asked, 1 + 2 * top + K]: raw_logprobs.token_logprobs' columns, then the K
        log-probs of each row's logprob_ids (K the most any row asked; 0 when none did)."""
        asked = [i for i, r in enumerate(rows) if r.want_logprob]
        if not asked:
            return None
        top = max(rows[i].top_logprobs for i in asked)
        idx = None  # every row asked (the usual RL batch): no gather
        if len(asked) < len(rows):
            idx = torch.tensor(asked, dtype=torch.int64).to(logits.device, non_blocking=True)
        # Rows at T = 0 (greedy: T = 1 for log-probs) or T = 1 read their logits unscaled;
        # any other T goes through scaled_logits, which also keeps greedy rows unscaled.
        scale = any(rows[i].params.temperature not in (0.0, 1.0) for i in asked)
        # The CUDA sampler's pass-1 statistics, when it returns them (not the torch path nor
        # the sort-all baseline): the normaliser without another read of the logits.
        cm, cs = getattr(res, "chunk_max", None), getattr(res, "chunk_sumexp", None)
        chunks = (cm, cs) if cm is not None and cs is not None else None
        block = token_logprobs(
            logits, idx, temperature, res.tokens, top, scale=scale, chunks=chunks
        )
        top = (block.shape[1] - 1) // 2
        width = max(len(rows[i].logprob_ids) for i in asked)
        if width:
            # Padded with id 0; only each row's own count is read back.
            pad = [[*rows[i].logprob_ids, *[0] * (width - len(rows[i].logprob_ids))] for i in asked]
            wanted = torch.tensor(pad, dtype=torch.int64).to(logits.device, non_blocking=True)
            chosen = ids_logprobs(logits, idx, temperature, wanted, scale=scale)
            block = torch.cat([block, chosen], dim=1)
        return asked, top, block

    def _fill(self, rows: list[RowWork]) -> None:
        """Writes the rows' parameters to the host buffer and starts its copy to the device.

        Every row is keyed: unseeded rows get a fresh random 63-bit key, which is what kernels
        does for seed=None, so the sampler always runs one variant (its seeded one) and its
        unseeded one is never compiled nor its device random draw launched."""
        b = len(rows)
        if b > self.capacity:
            self._allocate(b)
        if self.copied is not None:
            # The previous copy from the host buffer: long complete, as every step ends in a
            # copy back; this only guards the rewrite.
            self.copied.synchronize()
        h = self.host_fields
        params = [r.params for r in rows]
        h["temperature"][:b] = [p.temperature for p in params]
        h["top_p"][:b] = [p.top_p for p in params]
        h["min_p"][:b] = [p.min_p for p in params]
        # top_k >= V means off (docs/design.md), so clamping to the int32 range keeps its meaning.
        h["top_k"][:b] = [min(p.top_k, INT32_MAX) for p in params]
        h["bounded"][:b] = [r.bounded for r in rows]
        h["want_mask"][:b] = [r.want_mask for r in rows]
        h["seed"][:b] = [p.seed if p.seed is not None else random.getrandbits(63) for p in params]
        h["step"][:b] = [r.step for r in rows]
        if self.copied is not None:
            self.device_buf.copy_(self.host_buf[: self.device_buf.numel()], non_blocking=True)
            self.copied.record()

    def _allocate(self, batch: int) -> None:
        """Buffers for up to `batch` rows, rounded up to a multiple of 16."""
        cap = -(-batch // 16) * 16
        spans = {}
        size = 0
        for name, dtype in _FIELDS:
            spans[name] = (size, size + cap * dtype.itemsize)
            size += -(-cap * dtype.itemsize // ALIGN) * ALIGN
        self.host_buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.cuda)
        # Every field but want_mask goes to the device; on CPU the sampler reads host_buf.
        self.device_buf = self.host_buf
        if self.cuda:
            on_device = spans["want_mask"][0]
            self.device_buf = torch.empty(on_device, dtype=torch.uint8, device=self.device)
        host = self.host_buf.numpy()
        for name, dtype in _FIELDS:
            lo, hi = spans[name]
            self.host_fields[name] = host[lo:hi].view(_NUMPY[dtype])
            buf = self.host_buf if name == "want_mask" else self.device_buf
            self.fields[name] = buf[lo:hi].view(dtype)
        self.views.clear()
        self.capacity = cap


class SampledRows:
    """A launched sampler call: its results are copied back in one device-to-host copy of
    everything but the mask ids, issued at launch into pinned memory, and one of the mask ids
    (their count is known only from the first), made on a side stream so that it does not
    wait for a step launched after this one."""

    def __init__(
        self,
        res: Any,
        rows: list[RowWork],
        raw: tuple[list[int], int, torch.Tensor] | None,
        timer: _Timer,
        mask_copy: MaskIdsCopy,
    ) -> None:
        self.res, self.rows, self.raw, self.timer = res, rows, raw, timer
        self.mask_copy = mask_copy
        self.tokens: torch.Tensor = res.tokens  # on the device: a later step's PENDING tokens
        b = len(rows)
        num_masks = sum(r.want_mask for r in rows)
        parts = [res.tokens, res.logprobs, res.nan_rows, res.fallback_rows]
        if num_masks:
            parts += [res.support_sizes, res.mask_status, res.mask_offsets]
        # One float64 block holds every value exactly (ids, sizes and offsets are < 2**53,
        # the log-probs float32); `out=` casts each part straight to it.
        size = 4 * b + (b + 2 * num_masks + 1 if num_masks else 0)
        if raw is not None:
            parts.append(raw[2].reshape(-1))
            size += raw[2].numel()
        block = torch.empty(size, dtype=torch.float64, device=res.tokens.device)
        torch.cat(parts, out=block)
        self.cuda = block.device.type == "cuda"
        self.host = block
        self.wait_seconds = 0.0  # the host blocked on the device in collect()
        self.done: torch.cuda.Event | None = None
        if self.cuda:
            self.host = torch.empty(size, dtype=torch.float64, pin_memory=True)
            self.host.copy_(block, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()

    def collect(self) -> tuple[list[RowResult], float, int]:
        """Per-row results, the sampler's seconds and its slow-pass row count (as `sample`)."""
        if self.done is not None:
            t0 = time.perf_counter()
            self.done.synchronize()
            self.wait_seconds += time.perf_counter() - t0
        results, num_fallback = _to_rows(self, self.rows, self.raw)
        return results, self.timer.seconds(), num_fallback

    def mask_ids(self, count: int) -> np.ndarray:
        """The first `count` mask ids, int32 on the host: on CUDA copied on a side stream
        that waits only for this step's results (mask_copy.py), not for a later step."""
        t0 = time.perf_counter()
        ids = self.mask_copy.copy(self.res.mask_ids, count, after=self.done)
        if self.cuda:
            self.wait_seconds += time.perf_counter() - t0
        return ids


def _to_rows(
    sampled: SampledRows,
    rows: list[RowWork],
    raw: tuple[list[int], int, torch.Tensor] | None = None,
) -> tuple[list[RowResult], int]:
    """A sampler call's results back on the host (and the raw log-probs of the rows that
    asked) to per-row results."""
    b = len(rows)
    # res.mask_rows is these rows, ascending: known here, so not copied.
    mask_rows = [i for i, r in enumerate(rows) if r.want_mask]
    num_masks = len(mask_rows)
    meta_end = 4 * b + (b + 2 * num_masks + 1 if num_masks else 0)
    values = sampled.host.cpu().numpy()
    tokens = values[:b].astype(np.int64).tolist()
    nan = (values[2 * b : 3 * b] != 0).tolist()
    num_fallback = int(np.count_nonzero(values[3 * b : 4 * b]))
    # Positional: RowResult(token, logprob, mask, mask_status, support_size, nan).
    results = list(
        map(RowResult, tokens, values[b : 2 * b].tolist(), repeat(None), repeat(0), repeat(0), nan)
    )
    if raw is not None:
        _attach_raw(results, rows, raw, values[meta_end:])
    if num_masks:
        meta = values[4 * b : meta_end].astype(np.int64)
        sizes = meta[:b].tolist()
        status = meta[b : b + num_masks].tolist()
        offsets = meta[b + num_masks :].tolist()
        ids = sampled.mask_ids(offsets[-1])
        for j, row in enumerate(mask_rows):
            r = results[row]
            r.mask_status = st = status[j]
            r.support_size = sizes[row]
            # A copy, not a view: a view would keep the whole step's ids alive for as long
            # as its longest sequence runs.
            r.mask = None if st == STATUS_OVERFLOW else ids[offsets[j] : offsets[j + 1]].copy()
    return results, num_fallback


def _attach_raw(
    results: list[RowResult],
    rows: list[RowWork],
    raw: tuple[list[int], int, torch.Tensor],
    values: np.ndarray,
) -> None:
    """The raw log-prob block (raw_logprobs.token_logprobs, on the host) onto the results."""
    asked, top, block = raw  # top: cut at the vocabulary when more were asked
    width = block.shape[1]
    table = values.reshape(len(asked), width)
    lps = table[:, 0].tolist()
    for j, i in enumerate(asked):
        r = results[i]
        r.raw_logprob = lps[j]
        k = min(rows[i].top_logprobs, top)
        if k > 0:
            vals = table[j, 1 : 1 + k].tolist()
            ids = table[j, 1 + top : 1 + top + k].astype(np.int64).tolist()
            r.top = list(zip(vals, ids, strict=True))
        if rows[i].logprob_ids:
            lo = 1 + 2 * top
            r.ids_logprobs = table[j, lo : lo + len(rows[i].logprob_ids)].tolist()


class _Timer:
    """Time of the sampler call: CUDA events on CUDA (device time, read once the results are
    back, so timing adds no wait), perf_counter around the call on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.t0 = time.perf_counter()

    def mark(self) -> None:
        """The end of the timed region (just after the sampler call)."""
        if self.cuda:
            self.end.record()
        else:
            self.t1 = time.perf_counter()

    def seconds(self) -> float:
        if self.cuda:
            self.end.synchronize()  # already passed when the results have been copied back
            return self.begin.elapsed_time(self.end) / 1000.0
        return self.t1 - self.t0

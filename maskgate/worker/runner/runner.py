"""ModelRunner: all device work of a step: batch assembly, forward, sampling.

`run(rows)` flattens the step's rows into one token batch (decode rows first, then prefill
chunks), runs the decoder over the slot KV cache, takes logits only at the last token of rows
that sample, and calls `kernels.sample` (the one sampler) for tokens, log-probs and masks.

`run` is `launch(rows).collect()`. `launch` queues the step's device work and the copies of
its results to pinned host memory, and returns without waiting for the device; `collect`
waits for those copies and builds the `RowResult`s. The engine's overlap schedule launches
step N + 1 before it collects step N. A decode row of step N + 1 may then feed `PENDING`:
the token its slot's row of step N sampled, which the runner takes from the device.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from maskgate import kernels
from maskgate.kernels import sample_sort_all_rows
from maskgate.protocol.policy_settings import MAX_MASK_TOKENS
from maskgate.worker.engine.batch import PENDING, RowResult, RowWork, StepStats
from maskgate.worker.engine.kv_cache import allocate_kv_cache, bytes_per_slot
from maskgate.worker.model import LoadedModel, load
from maskgate.worker.model.attention import build_attn_batch
from maskgate.worker.runner.cuda_graphs import DecodeGraphs
from maskgate.worker.runner.raw_logprobs import score_prompts
from maskgate.worker.runner.row_sampling import RowSampler, SampledRows, warm_up_sampler

# Default KV budget when none is given: on CPU a fixed 2 GiB; on CUDA the free memory after
# loading the weights, less headroom for activations, logits and CUDA graphs.
CPU_DEFAULT_KV_BYTES = 2 * 2**30
CUDA_KV_FRACTION = 0.9
CUDA_HEADROOM_BYTES = 4 * 2**30


class ModelRunner:
    """Implements worker.engine.batch.Runner."""

    def __init__(
        self,
        model: LoadedModel | str,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        max_num_slots: int = 64,
        max_model_len: int | None = None,
        kv_cache_bytes: int | None = None,
        max_mask_tokens: int = MAX_MASK_TOKENS,
        cuda_graphs: bool = True,
        progress: Callable[[str], None] | None = None,
        mask_impl: str = "kernel",
        fused_kernels: bool = True,
    ) -> None:
        if mask_impl not in ("kernel", "sort_all_rows"):
            raise ValueError(f"mask_impl must be 'kernel' or 'sort_all_rows', got {mask_impl!r}")
        # sort_all_rows: the benchmark baseline (maskgate/kernels/sort_all.py), same arguments and result.
        self.sample_fn = kernels.sample if mask_impl == "kernel" else sample_sort_all_rows
        if isinstance(model, str):
            model = load(model, device, dtype, progress)
        self.loaded = model
        self.model = model.model
        self.config = cfg = model.config
        self.device = model.device
        self.vocab_size = model.vocab_size
        self.eos_token_ids = model.eos_token_ids
        self.max_mask_tokens = max_mask_tokens
        max_len = max_model_len or cfg.max_position_embeddings
        if not 2 <= max_len <= cfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len={max_len} must be in [2, {cfg.max_position_embeddings}] "
                f"(the model's max_position_embeddings)"
            )
        if kv_cache_bytes is None:
            kv_cache_bytes = self._default_kv_bytes(max_num_slots, max_len)
        self.kv = allocate_kv_cache(
            cfg,
            max_num_slots=max_num_slots,
            max_model_len=max_len,
            budget_bytes=kv_cache_bytes,
            device=self.device,
            dtype=model.dtype,
        )
        self.kv_layers = self.kv.layers()
        self.max_num_slots = self.kv.num_slots
        self.max_model_len = max_len
        # Slots whose sequence produced NaN logits: their K/V may hold NaN, and a later
        # sequence reads stale entries past its length (masked, but 0 * NaN is NaN).
        self.nan_slots: set[int] = set()
        # The Triton kernels of maskgate/worker/model (fused norm, rope + KV store, SiLU-mul, decode
        # attention) on CUDA; the torch path otherwise. Off on CUDA: the before/after switch
        # of bench/worker_decode.py, and the reference the GPU tests compare against.
        self.fused = fused_kernels and self.device.type == "cuda"
        self.graphs = (
            DecodeGraphs(self.model, self.kv, max_batch=self.max_num_slots, fused=self.fused)
            if cuda_graphs and self.device.type == "cuda"
            else None
        )
        self.sampler = RowSampler(self.sample_fn, self.device, max_mask_tokens)
        # The last launched step's sampled tokens (on the device) and, by slot, their rows:
        # where a PENDING token of the next step comes from.
        self.prev_tokens: torch.Tensor | None = None
        self.prev_index: dict[int, int] = {}
        if self.device.type == "cuda":
            # Every sampling row holds its own KV slot: at most max_num_slots rows a step.
            warm_up_sampler(
                self.sample_fn, self.vocab_size, self.device, max_mask_tokens, self.max_num_slots
            )
            if self.fused:
                self._warm_up_fused()

    @torch.inference_mode()
    def _warm_up_fused(self) -> None:
        """Compile the fused kernels before traffic (same reason as the sampler warm-up): one
        eager step of a decode row and a two-token prefill row, both in the scratch slot
        (whose contents never matter), and the split variant of the decode attention."""
        from maskgate.worker.model.triton_decode_attn import decode_attention

        scratch = self.kv.scratch_slot
        self._forward([RowWork(scratch, [0], 1, True), RowWork(scratch, [0, 0], 0, True)])
        q = torch.zeros(
            (1, self.config.num_attention_heads, self.config.head_dim),
            device=self.device,
            dtype=self.loaded.dtype,
        )
        # Separate allocations: a view at an 8-byte offset would compile an unaligned variant.
        slot = torch.tensor([scratch], device=self.device)
        pos = torch.tensor([1], device=self.device)
        k, v = self.kv_layers[0]
        decode_attention(q, k, v, slot, pos, self.config.sliding_window, 2, num_splits=2)
        torch.cuda.synchronize(self.device)

    def _default_kv_bytes(self, max_num_slots: int, max_len: int) -> int:
        wanted = (max_num_slots + 1) * bytes_per_slot(self.config, max_len, self.loaded.dtype)
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            return min(wanted, int(free * CUDA_KV_FRACTION) - CUDA_HEADROOM_BYTES)
        return min(wanted, CPU_DEFAULT_KV_BYTES)

    @torch.inference_mode()
    def release(self, slot: int) -> None:
        """Attention masks by position, so the next sequence just overwrites the slot; only a
        slot that produced NaN logits is zeroed first, so no NaN outlives its request."""
        if slot in self.nan_slots:
            self.nan_slots.discard(slot)
            self.kv.k[:, slot].zero_()
            self.kv.v[:, slot].zero_()

    @torch.inference_mode()
    def copy_kv(self, copies: list[tuple[int, int, int, int]]) -> None:
        """Device-to-device copies, queued on the stream ahead of the step's forward. A copy
        of a slot that produced NaN marks its target too (zeroed when released)."""
        k, v = self.kv.k, self.kv.v
        for src, dst, start, end in copies:
            k[:, dst, :, start:end] = k[:, src, :, start:end]
            v[:, dst, :, start:end] = v[:, src, :, start:end]
            if src in self.nan_slots:
                self.nan_slots.add(dst)

    def run(self, rows: list[RowWork]) -> tuple[list[RowResult | None], StepStats]:
        return self.launch(rows).collect()

    @torch.inference_mode()
    def launch(self, rows: list[RowWork]) -> Launched:
        """Queue the step; its results come from `collect()` on what this returns."""
        stats = StepStats(num_rows=len(rows))
        if not rows:
            return Launched(self, rows, [], stats, {}, None)
        order, stats.num_tokens = self._order(rows)
        prompt: dict[int, RowResult] = {}  # row index -> its prompt log-probs
        logits = self._logits(order, rows, prompt)
        sampling = [i for i in order if rows[i].sample]
        sampled = None
        if sampling:
            sampled = self.sampler.launch(logits, [rows[i] for i in sampling])
            self.prev_tokens = sampled.tokens
        self.prev_index = {rows[i].slot: j for j, i in enumerate(sampling)}
        return Launched(self, rows, sampling, stats, prompt, sampled)

    @torch.inference_mode()
    def logits(self, rows: list[RowWork]) -> torch.Tensor:
        """Run a step without sampling: float32 logits [rows with sample=True, vocab], in the
        order of `rows`. Writes the KV cache exactly as `run` does."""
        order, _ = self._order(rows)
        logits = self._logits(order, rows)
        sampling = [i for i in order if rows[i].sample]
        back = sorted(range(len(sampling)), key=lambda j: sampling[j])
        return logits[torch.tensor(back, dtype=torch.int64, device=logits.device)]

    def _order(self, rows: list[RowWork]) -> tuple[list[int], int]:
        """Validates the rows; returns their indices with decode rows (one token) first, in
        their given order otherwise, and the number of tokens they feed. One pass: it runs on
        the host before every step."""
        decode: list[int] = []
        longer: list[int] = []
        slots: set[int] = set()
        num_tokens = 0
        num_slots, max_len, vocab = self.max_num_slots, self.max_model_len, self.vocab_size
        for i, r in enumerate(rows):
            ids = r.token_ids
            n = len(ids)
            if not 0 <= r.slot < num_slots:
                raise ValueError(f"slot {r.slot} outside [0, {num_slots})")
            if n == 0 or r.start_pos < 0 or r.start_pos + n > max_len:
                raise ValueError(
                    f"row feeds positions [{r.start_pos}, {r.start_pos + n}); "
                    f"allowed: non-empty within [0, {max_len})"
                )
            if n == 1:
                if ids[0] == PENDING:
                    if r.slot not in self.prev_index:
                        raise ValueError(
                            f"token id outside [0, {vocab}) (PENDING needs a sampling row of "
                            "the slot in the step launched last)"
                        )
                elif not 0 <= ids[0] < vocab:
                    raise ValueError(f"token id outside [0, {vocab})")
                decode.append(i)
            else:
                if min(ids) < 0 or max(ids) >= vocab:
                    raise ValueError(f"token id outside [0, {vocab})")
                longer.append(i)
            if r.prompt_targets and not 0 <= r.prompt_from <= n - len(r.prompt_targets):
                raise ValueError("prompt_targets reach past the row's positions")
            slots.add(r.slot)
            num_tokens += n
        if len(slots) != len(rows):
            raise ValueError("two rows of one step share a KV slot")
        return decode + longer, num_tokens

    def _logits(
        self, order: list[int], rows: list[RowWork], prompt: dict[int, RowResult] | None = None
    ) -> torch.Tensor:
        """Forward the rows in `order`; logits [num sampling rows, vocab] float32, same order.
        Rows with prompt_targets get their prompt log-probs in `prompt` (by row index)."""
        ordered = [rows[i] for i in order]
        pending = self._pending(ordered)
        # Graphs keep last-token logits only: a row scoring prompt tokens runs eagerly.
        graphs = self.graphs
        if graphs is not None and graphs.can_run(ordered) and not _scores_prompt(ordered):
            return graphs.run(ordered, pending)
        scored: dict[int, RowResult] = {}
        logits = self._forward(ordered, scored, pending)
        if prompt is not None:
            prompt.update({order[j]: res for j, res in scored.items()})
        return logits

    def _pending(self, ordered: list[RowWork]) -> Callable[[torch.Tensor], None] | None:
        """For rows feeding PENDING (decode rows, so token j of the step is row j's): a
        function that writes, on the device, the tokens they stand for into the step's ids."""
        where = [j for j, r in enumerate(ordered) if r.token_ids[0] == PENDING]
        if not where:
            return None
        prev = self.prev_tokens
        assert prev is not None, "a pending token needs a launched step"
        src = [self.prev_index[ordered[j].slot] for j in where]
        host = torch.tensor([where, src], dtype=torch.int64, pin_memory=self.device.type == "cuda")
        idx = host.to(self.device, non_blocking=True)

        def fill(ids: torch.Tensor) -> None:
            ids.index_copy_(0, idx[0], prev.index_select(0, idx[1]).to(ids.dtype))

        return fill

    def _forward(
        self,
        ordered: list[RowWork],
        prompt: dict[int, RowResult] | None = None,
        pending: Callable[[torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """An eager step over rows already ordered (decode rows first); logits as _logits.
        Rows with prompt_targets get their prompt log-probs in `prompt`, keyed by their
        index in `ordered`."""
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        last: list[int] = []  # flat index of each sampling row's last token
        for r in ordered:
            n = len(r.token_ids)
            ids.extend(r.token_ids)
            pos.extend(range(r.start_pos, r.start_pos + n))
            slots.extend([r.slot] * n)
            if r.sample:
                last.append(len(ids) - 1)
        # One host-to-device copy for all index vectors of the step, each row padded to an
        # even length so every row starts 16-byte aligned: Triton compiles a kernel variant
        # per pointer alignment, and an odd token count would otherwise add one mid-traffic.
        # Row 3 holds `last`, so no copy (a wait on the queued forward) comes after the
        # forward; pinned on CUDA, so the copy does not wait for the device either.
        n = len(ids)
        pad = [0] * (n % 2)
        last_row = last + [0] * (n + len(pad) - len(last))
        host = torch.tensor(
            [ids + pad, pos + pad, slots + pad, last_row],
            dtype=torch.int64,
            pin_memory=self.device.type == "cuda",
        )
        dev = host.to(self.device, non_blocking=True)
        if pending is not None:
            pending(dev[0])
        flat = dev[:3, :n]
        batch = build_attn_batch(
            write_slots=flat[2],
            positions=flat[1],
            row_lens=[len(r.token_ids) for r in ordered],
            row_slots=[r.slot for r in ordered],
            row_starts=[r.start_pos for r in ordered],
            num_heads_per_kv=self.config.num_attention_heads // self.config.num_key_value_heads,
            sliding_window=self.config.sliding_window,
            dtype=self.loaded.dtype,
            fused=self.fused,
        )
        with self._eager_attention():
            hidden = self.model(flat[0], flat[1], self.kv_layers, batch)
        if prompt is not None:
            score_prompts(ordered, hidden, self.model.compute_logits, prompt)
        if not last:
            return hidden.new_empty((0, self.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden[dev[3, : len(last)]])

    def _eager_attention(self) -> AbstractContextManager[object]:
        """SDPA backends for eager steps. On the H200 eager decode steps took 60-97 ms whatever
        the batch, against ~4 ms replayed from a graph, which looks like per-shape set-up in
        the chosen attention backend (every eager step brings a new key length). The suspect
        is cuDNN attention, which builds a plan per shape, so eager steps leave it out; not
        yet re-measured. Captured graphs keep the default choice they were measured with."""
        if self.device.type != "cuda":
            return nullcontext()
        return sdpa_kernel(
            [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        )


def _scores_prompt(rows: list[RowWork]) -> bool:
    return any(r.prompt_targets for r in rows)


class Launched:
    """A launched step: `collect()` waits for its results and returns them as `run` does."""

    def __init__(
        self,
        runner: ModelRunner,
        rows: list[RowWork],
        sampling: list[int],
        stats: StepStats,
        prompt: dict[int, RowResult],
        sampled: SampledRows | None,
    ) -> None:
        self.runner, self.rows, self.sampling = runner, rows, sampling
        self.stats, self.prompt, self.sampled = stats, prompt, sampled

    @torch.inference_mode()
    def collect(self) -> tuple[list[RowResult | None], StepStats]:
        rows, stats = self.rows, self.stats
        out: list[RowResult | None] = [None] * len(rows)
        if self.sampled is not None:
            results, stats.mask_seconds, stats.num_fallback_rows = self.sampled.collect()
            stats.device_wait_seconds = self.sampled.wait_seconds
            for i, res in zip(self.sampling, results, strict=True):
                out[i] = res
                if res.nan:
                    self.runner.nan_slots.add(rows[i].slot)
        for i, scored in self.prompt.items():
            sampled = out[i]
            if sampled is None:  # a prompt chunk that samples nothing: token -1
                out[i] = scored
            else:
                sampled.prompt_logprobs, sampled.prompt_top = (
                    scored.prompt_logprobs,
                    scored.prompt_top,
                )
                sampled.prompt_ids_logprobs = scored.prompt_ids_logprobs
        return out, stats

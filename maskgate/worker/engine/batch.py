"""The step contract between the scheduler (torch-free) and the model runner (all device code).

The scheduler decides, each step, which sequences run and which tokens they feed; it hands the
runner a list of `RowWork` and gets back one `RowResult` per row that samples. Nothing here
imports torch, so the scheduler and its tests stay on plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    import numpy as np

# One token's mask ids in mask order: an int32 NumPy array cut from its step's host copy
# (worker/mask_copy.py), so no Python int is made per id; lists where a test builds them.
MaskIds: TypeAlias = "list[int] | np.ndarray"

# A decode row's token while the step that samples it is still in flight (the overlap
# schedule): the runner feeds the token its slot's row of the previous step sampled.
PENDING = -1


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Resolved sampling parameters of one sequence (defaults already applied)."""

    temperature: float = 1.0
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    # Keyed noise (docs/design.md): the same (seed, step, logits, params) gives the same token at
    # any batch position. None: unseeded draws.
    seed: int | None = None


@dataclass(slots=True)
class RowWork:
    """One sequence's share of a step.

    `token_ids` are fed at positions `start_pos .. start_pos + len(token_ids) - 1` into the KV
    slot `slot`. A decode row feeds one token; a prefill row feeds a (possibly chunked) slice
    of the prompt. Only rows with `sample=True` produce a result (the last prefill chunk and
    every decode row).
    """

    slot: int
    token_ids: list[int]
    start_pos: int
    sample: bool
    params: SamplingParams = field(default_factory=SamplingParams)
    want_mask: bool = False
    bounded: bool = False  # bounded mode (docs/design.md, the cap); exact mode otherwise
    step: int = 0  # index of the output token being sampled (keys the seeded noise)
    # Raw-distribution log-probs (log_softmax(logits / T), T = 1 for greedy rows) of the
    # sampled token, plus its `top_logprobs` most likely tokens; rows that ask nothing pay
    # nothing.
    want_logprob: bool = False
    top_logprobs: int = 0
    # Prompt log-probs: the logits at positions start_pos + prompt_from + i (i < len(targets))
    # score prompt_targets[i], the prompt token that follows (log_softmax at T = 1).
    prompt_from: int = 0
    prompt_targets: list[int] | None = None
    # want_logprob rows: log-probs of these ids too, at the sampled position and at every
    # scored prompt position (SGLang's token_ids_logprob).
    logprob_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class RowResult:
    token: int
    logprob: float  # under the truncated, renormalised distribution
    mask: MaskIds | None = None  # ids in mask order; None when not asked or overflow
    mask_status: int = 0  # 0 ok, 1 overflow (exact mode; nothing to commit), 2 truncated
    support_size: int = 0  # |S| before any cap (0 when no mask was asked)
    nan: bool = False  # NaN in the row's logits: fail the request, never commit the token
    raw_logprob: float | None = None  # want_logprob rows: the token's raw log-prob
    top: list[tuple[float, int]] | None = None  # top_logprobs > 0: (log-prob, id), descending
    # Rows with prompt_targets: one log-prob (and top list) per target. A prompt chunk that
    # samples nothing answers with token -1 when it scored prompt tokens, None otherwise.
    prompt_logprobs: list[float] | None = None
    prompt_top: list[list[tuple[float, int]]] | None = None
    # Rows with logprob_ids: their log-probs, in the row's order (per scored prompt position
    # for prompt_ids_logprobs).
    ids_logprobs: list[float] | None = None
    prompt_ids_logprobs: list[list[float]] | None = None


@dataclass(slots=True)
class StepStats:
    num_rows: int = 0
    num_tokens: int = 0
    mask_seconds: float = 0.0  # time in the sampler for this step (mask kernel time)
    num_fallback_rows: int = 0
    # The host blocked on the device for this step's results (the copies back, CUDA only).
    device_wait_seconds: float = 0.0


class Launch(Protocol):
    """A launched step (Runner.launch): its results, once the device is done with it."""

    def collect(self) -> tuple[list[RowResult | None], StepStats]: ...


class Runner(Protocol):
    """What the engine needs from the model runner."""

    vocab_size: int
    max_num_slots: int  # KV slots preallocated from the memory budget
    max_model_len: int  # tokens per slot (prompt + output)
    eos_token_ids: frozenset[int]

    def run(self, rows: list[RowWork]) -> tuple[list[RowResult | None], StepStats]:
        """Run one forward step; one entry per row, None for rows with sample=False (unless
        they scored prompt tokens: then a result with token -1 and prompt_logprobs)."""
        ...

    def launch(self, rows: list[RowWork]) -> Launch:
        """`run` without waiting for the results: `launch(rows).collect() == run(rows)`. A
        decode row may feed PENDING when its slot had a sampling row in the step launched
        just before (that row's token, taken on the device)."""
        ...

    def release(self, slot: int) -> None:
        """The slot's sequence finished or was aborted; its KV entries may be reused."""
        ...

    def copy_kv(self, copies: list[tuple[int, int, int, int]]) -> None:
        """Prefix cache hits: for each (src, dst, start, end), copy the K/V at positions
        [start, end) of slot src into slot dst, in order, before the next step's forward."""
        ...

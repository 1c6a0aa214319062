"""Request state: one `Sequence` per generated completion (a choice of `n`, an item of a batch).

The scheduler owns the mutable fields (status, slot, progress, outputs); the API layer builds a
sequence from a validated request and reads it back through the engine's events. Nothing here
imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, auto

from maskgate.protocol.errors import ApiError
from maskgate.worker.engine.batch import MaskIds, RowWork, SamplingParams


class SeqStatus(Enum):
    WAITING = auto()  # queued; holds no KV slot
    RUNNING = auto()  # holds a KV slot; prefilling (possibly over several steps) or decoding
    FINISHED = auto()


@dataclass(frozen=True, slots=True)
class StopRule:
    """When a sequence ends, besides the cap on its length."""

    max_new_tokens: int
    stop: tuple[str, ...] = ()  # stop strings; the output text is cut before the match
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False


@dataclass(slots=True)
class Sequence:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    rule: StopRule
    want_mask: bool = False
    bounded: bool = False
    # Raw-distribution log-probs (SGLang return_logprob): of each output token with its
    # top_logprobs most likely tokens, and, when logprob_start >= 0, of the prompt tokens
    # from that position on.
    want_logprob: bool = False
    top_logprobs: int = 0
    logprob_start: int = -1
    logprob_ids: tuple[int, ...] = ()  # token_ids_logprob: these ids' log-probs as well
    arrival: float = field(default_factory=time.monotonic)  # seconds, monotonic clock

    status: SeqStatus = SeqStatus.WAITING
    slot: int | None = None
    num_prefilled: int = 0  # tokens of prefill_ids whose KV is written
    num_cached: int = 0  # prompt tokens copied from the prefix cache rather than computed
    admit_order: int = 0  # admissions before this one (a sequence waits only on earlier ones)
    # Set when the sequence was retracted (its KV slot freed): prompt + the output so far,
    # recomputed as one prefill on readmission; None: just the prompt.
    recompute_ids: list[int] | None = None
    num_retractions: int = 0
    output_ids: list[int] = field(default_factory=list)
    # Per output token, only for mask rows (docs/design.md, Mask semantics).
    logprobs: list[float] = field(default_factory=list)
    masks: list[MaskIds] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    # want_logprob only: per output token, and per prompt token scored (positions
    # logprob_start + 1 .. len(prompt_ids) - 1).
    raw_logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    input_top: list[list[tuple[float, int]]] = field(default_factory=list)
    ids_logprobs: list[list[float]] = field(default_factory=list)  # per output token
    input_ids_logprobs: list[list[float]] = field(default_factory=list)  # per scored prompt token
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    matched_stop: int | str | None = None  # the EOS/stop id or the stop string that ended it
    text_limit: int | None = None  # chars of the decoded output kept (cut before a stop string)
    error: ApiError | None = None
    abort_message: str | None = None  # why an abort came (pause, /abort_request, ...)
    decode_row: RowWork | None = None  # reused by the scheduler, in turn with spare_row
    spare_row: RowWork | None = None
    num_in_flight: int = 0  # rows of launched steps whose results are not back yet
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def prefill_ids(self) -> list[int]:
        """The tokens to write into the KV slot before decoding."""
        return self.prompt_ids if self.recompute_ids is None else self.recompute_ids

    @property
    def is_prefilling(self) -> bool:
        return self.num_prefilled < len(self.prefill_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def next_position(self) -> int:
        """Position of the token a decode step feeds (the last sampled one)."""
        return len(self.prompt_ids) + len(self.output_ids) - 1

    def finish(self, reason: str, matched: int | str | None = None) -> None:
        self.status = SeqStatus.FINISHED
        self.finish_reason = reason
        self.matched_stop = matched

    def fail(self, err: ApiError) -> None:
        self.error = err
        self.finish("error")

"""Raw-distribution log-prob options of a request: SGLang's /generate fields and OpenAI's.

/generate: `return_logprob` (bool), `top_logprobs_num` (int >= 0), `logprob_start_len` (int:
-1 = output tokens only, s >= 0 = the prompt tokens from position s on as well) and
`return_text_in_logprobs` (bool). In a batch the first three may be lists, one value per
prompt, as SGLang allows. Chat: `logprobs` (bool) and `top_logprobs` (int, needs logprobs).
Completions: `logprobs` (int, the number of top log-probs; null = off). Types are strict, as
for every other field (`true` is not an int, `"5"` is not an int).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maskgate.protocol.fields import is_int, json_type
from maskgate.worker.params import invalid, per_item

# The most top log-probs a position may ask for: each costs a topk over the vocabulary and a
# decoded string per position in the response. OpenAI allows 20 (chat and completions).
MAX_TOP_LOGPROBS = 1024
MAX_OPENAI_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class LogprobOptions:
    """What one sequence returns of the raw distribution (None elsewhere: nothing)."""

    top: int = 0  # top log-probs per position
    start: int = -1  # -1: output tokens only; s >= 0: prompt tokens from position s too
    text: bool = False  # decode each token id into the triples (return_text_in_logprobs)


def parse_generate_logprobs(
    body: Mapping[str, Any],
    prompt_lens: list[int],
    is_batch: bool,
    *,
    max_top: int = MAX_TOP_LOGPROBS,
) -> list[LogprobOptions | None]:
    """/generate body -> per-prompt options (None where return_logprob is off);
    `top_logprobs_num` at most `max_top` (the worker's max_top_logprobs_num)."""
    size = len(prompt_lens)
    flags = per_item(body.get("return_logprob"), size, is_batch, "return_logprob")
    tops = per_item(body.get("top_logprobs_num"), size, is_batch, "top_logprobs_num")
    starts = per_item(body.get("logprob_start_len"), size, is_batch, "logprob_start_len")
    text = body.get("return_text_in_logprobs")
    if text is not None and not isinstance(text, bool):
        raise invalid("return_text_in_logprobs", f"must be a bool, not {json_type(text)}")
    out: list[LogprobOptions | None] = []
    for i, (flag, top, start, n) in enumerate(zip(flags, tops, starts, prompt_lens, strict=True)):
        at = f"[{i}]" if is_batch and size > 1 else ""
        if flag is not None and not isinstance(flag, bool):
            raise invalid("return_logprob" + at, f"must be a bool, not {json_type(flag)}")
        top = _int(top, "top_logprobs_num" + at, 0, 0, min(max_top, MAX_TOP_LOGPROBS))
        start = _int(start, "logprob_start_len" + at, -1, -1, n - 1)
        out.append(LogprobOptions(top, start, bool(text)) if flag else None)
    return out


def parse_openai_logprobs(body: Mapping[str, Any], *, chat: bool) -> LogprobOptions | None:
    """Chat or completions body -> options (None when log-probs are off)."""
    value = body.get("logprobs")
    if chat:
        if value is not None and not isinstance(value, bool):
            raise invalid("logprobs", f"must be a bool, not {json_type(value)}")
        top = body.get("top_logprobs")
        if top is not None and not value:
            raise invalid("top_logprobs", "needs logprobs=true")
        if not value:
            return None
        return LogprobOptions(_int(top, "top_logprobs", 0, 0, MAX_OPENAI_TOP_LOGPROBS), -1, True)
    if value is None:
        return None
    return LogprobOptions(_int(value, "logprobs", 0, 0, MAX_OPENAI_TOP_LOGPROBS), -1, True)


def _int(value: Any, name: str, default: int, lo: int, hi: int) -> int:
    if value is None:
        return default
    if not is_int(value):
        raise invalid(name, f"must be an integer, not {json_type(value)}")
    if not lo <= value <= hi:
        raise invalid(name, f"must be in [{lo}, {hi}], got {value}")
    return int(value)

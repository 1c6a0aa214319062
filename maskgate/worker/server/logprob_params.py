"""Raw-distribution log-prob options of a request: SGLang's /generate fields and OpenAI's.

/generate: `return_logprob` (bool), `top_logprobs_num` (int >= 0), `logprob_start_len` (int:
-1 = output tokens only, s >= 0 = the prompt tokens from position s on as well),
`token_ids_logprob` (a list of token ids whose log-probs every position reports) and
`return_text_in_logprobs` (bool). In a batch the first three may be lists, one value per
prompt, and token_ids_logprob a list of one id list per prompt, as SGLang allows. Chat: `logprobs` (bool) and `top_logprobs` (int, needs logprobs).
Completions: `logprobs` (int, the number of top log-probs; null = off). Types are strict, as
for every other field (`true` is not an int, `"5"` is not an int).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maskgate.protocol.fields import is_int, json_type
from maskgate.worker.server.params import invalid, per_item

# The most top log-probs a position may ask for: each costs a topk over the vocabulary and a
# decoded string per position in the response. OpenAI allows 20 (chat and completions).
MAX_TOP_LOGPROBS = 1024
MAX_OPENAI_TOP_LOGPROBS = 20
# The most ids token_ids_logprob may name: each is a log-prob (and a decoded string) per
# position in the response, as a top log-prob is.
MAX_TOKEN_IDS_LOGPROB = 1024


@dataclass(frozen=True, slots=True)
class LogprobOptions:
    """What one sequence returns of the raw distribution (None elsewhere: nothing)."""

    top: int = 0  # top log-probs per position
    start: int = -1  # -1: output tokens only; s >= 0: prompt tokens from position s too
    text: bool = False  # decode each token id into the triples (return_text_in_logprobs)
    ids: tuple[int, ...] = ()  # token_ids_logprob: these ids' log-probs at every position


def parse_generate_logprobs(
    body: Mapping[str, Any],
    prompt_lens: list[int],
    is_batch: bool,
    vocab_size: int | None = None,
    *,
    max_top: int = MAX_TOP_LOGPROBS,
) -> list[LogprobOptions | None]:
    """/generate body -> per-prompt options (None where return_logprob is off); token ids
    are checked against `vocab_size` when given; `top_logprobs_num` at most `max_top` (the
    worker's max_top_logprobs_num)."""
    size = len(prompt_lens)
    flags = per_item(body.get("return_logprob"), size, is_batch, "return_logprob")
    tops = per_item(body.get("top_logprobs_num"), size, is_batch, "top_logprobs_num")
    starts = per_item(body.get("logprob_start_len"), size, is_batch, "logprob_start_len")
    ids = _token_ids(body.get("token_ids_logprob"), size, is_batch, vocab_size)
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
        out.append(LogprobOptions(top, start, bool(text), ids[i]) if flag else None)
    return out


def _token_ids(value: Any, size: int, is_batch: bool, vocab: int | None) -> list[tuple[int, ...]]:
    """token_ids_logprob: one id list for every prompt, or (a batch) one list per prompt."""
    name = "token_ids_logprob"
    if value is None:
        return [()] * size
    if isinstance(value, list) and value and all(isinstance(v, list | None) for v in value):
        if not is_batch or len(value) != size:
            want = f"a list of {size} id lists (one per prompt)" if is_batch else "one id list"
            raise invalid(name, f"must be {want} here")
        return [_id_list(v or [], f"{name}[{i}]", vocab) for i, v in enumerate(value)]
    return [_id_list(value, name, vocab)] * size


def _id_list(value: Any, name: str, vocab: int | None) -> tuple[int, ...]:
    hi = vocab if vocab is not None else 2**31
    if not isinstance(value, list) or not all(is_int(i) and 0 <= i < hi for i in value):
        raise invalid(name, f"must be a list of token ids in [0, {hi})")
    if len(value) > MAX_TOKEN_IDS_LOGPROB:
        raise invalid(name, f"names {len(value)} ids; the most is {MAX_TOKEN_IDS_LOGPROB}")
    return tuple(int(i) for i in value)


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

"""Rule 9, the payload budget of a mask request: an upper bound on the token ids (and log-prob
entries) its answer can hold, counted before anything runs.

    answers * max(max_tokens, 1) * (min(top_k or cap, cap) + log-prob width)
    + prompt log-prob rows * log-prob width

- `answers` is prompts x `n` (x `best_of` where it is larger); a request with
  `max_tokens: 0` still makes its answers, so each counts at least one token;
- the log-prob width of a token is 0 without log-probs, else 1 (the sampled token) +
  `top_logprobs_num` (`top_logprobs` on chat, `logprobs` on completions) +
  `len(token_ids_logprob)`;
- prompt log-prob rows: `/generate` with `logprob_start_len >= 0`, or completions with `echo`:
  the prompt's tokens, bounded by its length (a token is at least one UTF-8 byte).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.fields import Fields, is_int


@dataclass(frozen=True, slots=True)
class LogprobCost:
    width: int = 0  # entries per log-prob row (0: no log-probs)
    prompt_rows: int = 0  # prompt rows answered, over the whole request


def generate_cost(body: Mapping[str, Any], fields: Fields) -> LogprobCost:
    """The log-prob cost of a `/generate` body (its fields may be per item lists)."""
    wanted = _values(body, "return_logprob")
    for v in wanted:
        if not isinstance(v, bool):
            raise fields.invalid("return_logprob", "must be a bool or a list of bools")
    if not any(wanted):
        return LogprobCost()
    top = max(
        (_count(fields, "top_logprobs_num", v) for v in _values(body, "top_logprobs_num")),
        default=0,
    )
    ids = max((_id_list(fields, v) for v in _id_lists(body.get("token_ids_logprob"))), default=0)
    width = 1 + top + ids
    starts = [_start(fields, v) for v in _values(body, "logprob_start_len")]
    start = min((s for s in starts if s >= 0), default=-1)
    if start < 0:
        return LogprobCost(width)
    rows = max(0, prompt_tokens(body.get("text"), body.get("input_ids")) - start)
    return LogprobCost(width, rows)


def openai_cost(body: Mapping[str, Any], fields: Fields, chat: bool) -> LogprobCost:
    """Chat: `logprobs` (bool) with `top_logprobs`; completions: `logprobs` (int, the top
    count) and `echo` (the prompt's rows)."""
    if chat:
        if not fields.boolean(body, "logprobs"):
            return LogprobCost()
        return LogprobCost(1 + (fields.count(body, "top_logprobs", "") or 0))
    top = fields.integer(body, "logprobs", "", minimum=0)  # completions: the top count
    if top is None:
        return LogprobCost()
    echo = fields.boolean(body, "echo")
    rows = prompt_tokens(body.get("prompt"), None) if echo else 0
    return LogprobCost(1 + top, rows)


def prompt_tokens(text: Any, ids: Any) -> int:
    """An upper bound on a prompt's (or a batch's) tokens."""
    if isinstance(ids, list):
        if ids and isinstance(ids[0], list):
            return sum(len(x) for x in ids if isinstance(x, list))
        return len(ids)
    if isinstance(text, str):
        return len(text) if text.isascii() else 4 * len(text)
    if isinstance(text, list):
        if text and all(is_int(t) for t in text[:1]):
            return len(text)  # completions: one prompt of token ids
        return sum(prompt_tokens(t, None) for t in text)
    return 0


def check_payload(
    items: Sequence[tuple[int, int | None, int]],
    cost: LogprobCost,
    *,
    limit: int,
    default_max_tokens: int,
    param: str | None,
) -> None:
    """`items`: (answers, max_tokens, mask ids per token). 413-style PolicyError past `limit`."""
    total = cost.prompt_rows * cost.width
    for answers, max_tokens, per_token in items:
        tokens = default_max_tokens if max_tokens is None else max(max_tokens, 1)
        total += answers * tokens * (per_token + cost.width)
    if total > limit:
        raise PolicyError(
            "sampling_mask_payload_too_large",
            f"the masks and log-probs of this request could hold up to {total} entries "
            f"(prompts * n * max(max_tokens, 1) * (min(top_k or cap, cap) + log-prob width) "
            f"+ prompt log-prob rows); the limit is {limit}. Lower the prompt count, n, "
            "max_tokens, top_k or the log-prob fields.",
            param=param,
        )


def _values(body: Mapping[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    if value is None:
        return []
    return [v for v in value if v is not None] if isinstance(value, list) else [value]


def _count(fields: Fields, name: str, value: Any) -> int:
    if not is_int(value) or value < 0:
        raise fields.invalid(name, "must be a non-negative integer or a list of them")
    return int(value)


def _start(fields: Fields, value: Any) -> int:
    if not is_int(value) or value < -1:
        raise fields.invalid("logprob_start_len", "must be an integer >= -1 or a list of them")
    return int(value)


def _id_lists(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list) and value and isinstance(value[0], list | type(None)):
        return [v for v in value if v is not None]
    return [value]


def _id_list(fields: Fields, value: Any) -> int:
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        raise fields.invalid("token_ids_logprob", "must be a list of token ids, or one per item")
    return len(value)

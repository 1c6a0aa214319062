"""Bounds on what one request may ask of the worker, checked before any work is queued, and
tokenization off the event loop.

| bound (WorkerConfig) | answer |
|---|---|
| `max_sequences_per_request`: prompts x n, summed | 400 `too_many_sequences` |
| `max_prompt_bytes`: UTF-8 bytes of all prompt text, before tokenization | 413 `prompt_too_large` |
| `max_top_logprobs_num` (logprob_params) | 400 `invalid_parameter` |
| `max_prompt_logprob_rows`: scored prompt positions x n, summed | 400 `prompt_logprobs_too_large` |

Tokenizers and chat templates run in a worker thread (`asyncio.to_thread`): a long prompt
costs that thread seconds, never the event loop, so `/health` and streams keep answering.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

from maskgate.protocol.errors import ApiError
from maskgate.worker.server.state import WorkerState

T = TypeVar("T")


def check_sequences(state: WorkerState, count: int, what: str = "prompts x n") -> None:
    limit = state.config.max_sequences_per_request
    if count > limit:
        raise ApiError(
            "too_many_sequences",
            f"the request asks for {count} sequences ({what}); this worker serves at most "
            f"{limit} per request (max_sequences_per_request). Split it into smaller requests.",
        )


def check_prompt_bytes(state: WorkerState, texts: Sequence[str], param: str) -> None:
    limit = state.config.max_prompt_bytes
    chars = sum(len(t) for t in texts)
    if 4 * chars <= limit:  # at most 4 bytes a character: no need to encode
        return
    if chars > limit or sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) > limit:
        raise ApiError(
            "prompt_too_large",
            f"{param} holds more than {limit} bytes of text (max_prompt_bytes)",
            status=413,
            param=param,
        )


def check_prompt_logprob_rows(state: WorkerState, rows: int) -> None:
    limit = state.config.max_prompt_logprob_rows
    if rows > limit:
        raise ApiError(
            "prompt_logprobs_too_large",
            f"the request scores {rows} prompt positions (prompt length - logprob_start_len, "
            f"times n, summed over prompts); this worker allows {limit} "
            "(max_prompt_logprob_rows). Raise logprob_start_len or split the request.",
            param="logprob_start_len",
        )


async def off_loop(fn: Callable[[], T]) -> T:
    """`fn` (tokenizer work) in a worker thread."""
    return await asyncio.to_thread(fn)


async def encode_texts(
    state: WorkerState, texts: Sequence[str], param: str, *, add_special_tokens: bool = True
) -> list[list[int]]:
    """Token ids of each text, after the byte bound, off the event loop."""
    check_prompt_bytes(state, texts, param)
    tok = state.tokenizer
    return await off_loop(
        lambda: [list(tok.encode(t, add_special_tokens=add_special_tokens)) for t in texts]
    )

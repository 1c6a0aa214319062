"""Raw-distribution log-probs (SGLang's `return_logprob`), on the device, for the rows that ask.

Output tokens: log_softmax(logits / T) in float32 over the whole vocabulary, from the same
float32 logits the sampler drew the token from, T being the row's temperature (greedy rows,
T < 1e-6, use T = 1, as SGLang does). Prompt tokens: log_softmax(logits) at T = 1, as SGLang
computes input log-probs. A log-prob of -inf (a token whose logit is -inf) is clamped to the
most negative float32, as SGLang clamps, so every value is finite JSON.

Only rows that asked are read: the work is one gather of their logits rows, a logsumexp and,
for rows that want top log-probs, one topk over those rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from maskgate.kernels.order import scaled_logits
from maskgate.worker.batch import RowResult, RowWork

FLOAT32_MIN = torch.finfo(torch.float32).min
# Prompt positions scored per lm_head call: bounds the [positions, vocab] float32 logits
# (512 x 152k x 4 B = 311 MB at most).
PROMPT_BLOCK = 512


def token_logprobs(
    logits: torch.Tensor,
    rows: torch.Tensor | None,
    temperature: torch.Tensor,
    tokens: torch.Tensor,
    top: int,
    *,
    scale: bool = True,
) -> torch.Tensor:
    """Raw log-probs of sampled tokens, as one float32 block [R, 1 + 2 * top].

    logits [B, V] float32; rows [R] int64 (the rows that asked, on logits.device; None:
    all B);
    temperature [B] float32 and tokens [B] int64 for every row. Column 0 is the token's
    log-prob; columns 1..top the top log-probs (descending) and top+1..2*top their ids (as
    float32, exact below 2**24, so the whole block comes back in one copy). scale=False: the
    caller knows every row is greedy or has T = 1, so the logits are used as they are.
    """
    if rows is not None:
        logits, temperature, tokens = (
            t.index_select(0, rows) for t in (logits, temperature, tokens)
        )
    # No log_softmax is materialised: z - logsumexp(z) at the token (and the top values) only,
    # so a row costs one read of its logits (two when its temperature scales them).
    z = scaled_logits(logits, temperature) if scale else logits
    lse = torch.logsumexp(z, dim=1, keepdim=True)  # [R, 1]
    chosen = (z.gather(1, tokens[:, None]) - lse).clamp_(min=FLOAT32_MIN)
    if top <= 0:
        return chosen
    vals, ids = z.topk(min(top, z.shape[1]), dim=1)
    return torch.cat([chosen, (vals - lse).clamp_(min=FLOAT32_MIN), ids.to(torch.float32)], dim=1)


def score_prompts(
    rows: list[RowWork],
    hidden: torch.Tensor,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    out: dict[int, RowResult],
) -> None:
    """Prompt log-probs of the rows with prompt_targets, into out[row index] (token -1).

    rows: a step's rows in the order they were fed; hidden: [tokens of the step, H], the
    rows' tokens back to back. The lm_head runs on the scored positions only.
    """
    offset = 0
    for j, r in enumerate(rows):
        targets = r.prompt_targets
        if targets:
            lo = offset + r.prompt_from
            tgt = torch.tensor(targets, dtype=torch.int64).to(hidden.device)
            res = RowResult(token=-1, logprob=float("nan"))
            res.prompt_logprobs, res.prompt_top = prompt_logprobs(
                compute_logits, hidden[lo : lo + len(targets)], tgt, r.top_logprobs
            )
            out[j] = res
        offset += len(r.token_ids)


def prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    top: int,
) -> tuple[list[float], list[list[tuple[float, int]]] | None]:
    """Log-probs of prompt tokens at T = 1 from the hidden states that precede them.

    compute_logits: hidden [P, H] -> logits [P, V] float32 (the model's lm_head); hidden
    [P, H] at the positions before each target; targets [P] int64. Returns the P log-probs
    and, when top > 0, each position's top (log-prob, id) list (descending).
    """
    values: list[float] = []
    tops: list[list[tuple[float, int]]] = []
    for s in range(0, hidden.shape[0], PROMPT_BLOCK):
        lp = _log_softmax(compute_logits(hidden[s : s + PROMPT_BLOCK]))
        values.extend(lp.gather(1, targets[s : s + PROMPT_BLOCK, None]).squeeze(1).tolist())
        if top > 0:
            vals, ids = lp.topk(min(top, lp.shape[1]), dim=1)
            tops.extend(
                list(zip(v, i, strict=True))
                for v, i in zip(vals.tolist(), ids.tolist(), strict=True)
            )
    return values, tops if top > 0 else None


def _log_softmax(z: torch.Tensor) -> torch.Tensor:
    """z [R, V] float32 -> log-probs [R, V] float32, -inf clamped to the least float32."""
    return torch.log_softmax(z, dim=1).clamp_(min=FLOAT32_MIN)

"""Raw-distribution log-probs (SGLang's `return_logprob`), on the device, for the rows that ask.

Output tokens: log_softmax(logits / T) in float32 over the whole vocabulary, from the same
float32 logits the sampler drew the token from, T being the row's temperature (greedy rows,
T < 1e-6, use T = 1, as SGLang does). Prompt tokens: log_softmax(logits) at T = 1, as SGLang
computes input log-probs. A log-prob of -inf (a token whose logit is -inf) is clamped to the
most negative float32, as SGLang clamps, so every value is finite JSON.

Only rows that asked do any work. On CUDA the sampler's pass 1 already holds each row's
per-segment max and sum of exp(z - max) (SampleResult.chunk_max / chunk_sumexp), so the full
log-normaliser is a reduction over a few dozen segments and the token's log-prob a gather of
its logit: no second read of the row. Elsewhere (the torch path computes no such statistics
for every row) it is one logsumexp over the asking rows. Top log-probs need one topk over
the rows that want them, on any device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from maskgate.kernels import scaled_logits
from maskgate.worker.engine.batch import RowResult, RowWork

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
    chunks: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Raw log-probs of sampled tokens, as one float32 block [R, 1 + 2 * top].

    logits [B, V] float32; rows [R] int64 (the rows that asked, on logits.device; None: all
    B); temperature [B] float32 and tokens [B] int64 for every row. Column 0 is the token's
    log-prob; columns 1..top the top log-probs (descending) and top+1..2*top their ids (as
    float32, exact below 2**24, so the whole block comes back in one copy). scale=False: the
    caller knows every row is greedy or has T = 1, so the logits are used as they are.

    chunks: the sampler's pass-1 statistics (SampleResult.chunk_max, chunk_sumexp; [B, C]).
    With them the log-normaliser costs nothing more than the token's logit: the rows'
    logits are read again only for their top log-probs.
    """
    if rows is not None:
        temperature, tokens = temperature.index_select(0, rows), tokens.index_select(0, rows)
    z_rows = None
    if chunks is None or top > 0:
        x = logits if rows is None else logits.index_select(0, rows)
        z_rows = scaled_logits(x, temperature) if scale else x
    if chunks is None:
        assert z_rows is not None
        # No log_softmax is materialised: z - logsumexp(z) at the token (and the top values).
        lse = torch.logsumexp(z_rows, dim=1, keepdim=True)  # [R, 1]
        z_y = z_rows.gather(1, tokens[:, None])
    else:
        m, s = chunks if rows is None else (c.index_select(0, rows) for c in chunks)
        lse = chunk_lse(m, s)
        x_y = logits.gather(1, tokens[:, None]) if rows is None else logits[rows, tokens][:, None]
        z_y = scaled_logits(x_y, temperature) if scale else x_y  # the sampler's RN(x / T)
    chosen = (z_y - lse).clamp_(min=FLOAT32_MIN)
    if top <= 0:
        return chosen
    assert z_rows is not None
    vals, ids = z_rows.topk(min(top, z_rows.shape[1]), dim=1)
    return torch.cat([chosen, (vals - lse).clamp_(min=FLOAT32_MIN), ids.to(torch.float32)], dim=1)


def ids_logprobs(
    logits: torch.Tensor,
    rows: torch.Tensor | None,
    temperature: torch.Tensor,
    ids: torch.Tensor,
    *,
    scale: bool = True,
) -> torch.Tensor:
    """Raw log-probs of given token ids (SGLang's token_ids_logprob), float32 [R, K].

    logits [B, V] float32; rows [R] int64 (None: all B); temperature [B] float32; ids [R, K]
    int64 in [0, V) (rows with fewer ids pad with any valid id). Same distribution as
    token_logprobs: log_softmax(logits / T), greedy rows at T = 1.
    """
    x = logits if rows is None else logits.index_select(0, rows)
    if scale:
        x = scaled_logits(x, temperature if rows is None else temperature.index_select(0, rows))
    lse = torch.logsumexp(x, dim=1, keepdim=True)
    return (x.gather(1, ids) - lse).clamp_(min=FLOAT32_MIN)


def chunk_lse(chunk_max: torch.Tensor, chunk_sumexp: torch.Tensor) -> torch.Tensor:
    """log sum exp(z) of each row [R, 1] from per-segment max m_c and sum exp(z - m_c).

    A segment with no finite z (m_c = -inf) adds nothing; a row with none (a flagged row)
    gets -inf or NaN, and its request fails anyway.
    """
    top = chunk_max.amax(dim=1, keepdim=True)
    top = torch.where(top == float("-inf"), 0.0, top)
    live = chunk_max > float("-inf")
    mass = torch.where(live, chunk_sumexp * torch.exp(chunk_max - top), 0.0)
    return top + torch.log(mass.sum(dim=1, keepdim=True))


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
            res.prompt_logprobs, res.prompt_top, res.prompt_ids_logprobs = prompt_logprobs(
                compute_logits, hidden[lo : lo + len(targets)], tgt, r.top_logprobs, r.logprob_ids
            )
            out[j] = res
        offset += len(r.token_ids)


def prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    top: int,
    logprob_ids: tuple[int, ...] = (),
) -> tuple[list[float], list[list[tuple[float, int]]] | None, list[list[float]] | None]:
    """Log-probs of prompt tokens at T = 1 from the hidden states that precede them.

    compute_logits: hidden [P, H] -> logits [P, V] float32 (the model's lm_head); hidden
    [P, H] at the positions before each target; targets [P] int64. Returns the P log-probs,
    when top > 0 each position's top (log-prob, id) list (descending), and when logprob_ids
    is not empty each position's log-probs of those ids (None otherwise).
    """
    values: list[float] = []
    tops: list[list[tuple[float, int]]] = []
    chosen: list[list[float]] = []
    wanted = torch.tensor(logprob_ids, dtype=torch.int64).to(hidden.device) if logprob_ids else None
    for s in range(0, hidden.shape[0], PROMPT_BLOCK):
        lp = _log_softmax(compute_logits(hidden[s : s + PROMPT_BLOCK]))
        values.extend(lp.gather(1, targets[s : s + PROMPT_BLOCK, None]).squeeze(1).tolist())
        if top > 0:
            vals, ids = lp.topk(min(top, lp.shape[1]), dim=1)
            tops.extend(
                list(zip(v, i, strict=True))
                for v, i in zip(vals.tolist(), ids.tolist(), strict=True)
            )
        if wanted is not None:
            chosen.extend(lp.index_select(1, wanted).tolist())
    return values, tops if top > 0 else None, chosen if logprob_ids else None


def _log_softmax(z: torch.Tensor) -> torch.Tensor:
    """z [R, V] float32 -> log-probs [R, V] float32, -inf clamped to the least float32."""
    return torch.log_softmax(z, dim=1).clamp_(min=FLOAT32_MIN)

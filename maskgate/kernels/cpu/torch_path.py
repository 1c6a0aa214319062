"""The vectorised torch sampler (CPU tensors): the worker's CPU path, same semantics as Triton.

Shape of the work: one float top-k per row finds the value t of its 512th largest z; every token
with z > t is then in the top-k output, and sorting just those by packed (z, id) order keys
gives an exact prefix of the design order. resolve_support decides |S| from that prefix; only
the rows it cannot decide (flat rows, long top-p tails) pay for a longer prefix and, last, a
full sort of their keys. Greedy rows are one argmax (first maximal index = lowest id). The
pass over whole rows (scale, max, normaliser, argmax, the first top-k) goes a block of rows at
a time (ROW_BLOCK); the rest works on the prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from maskgate.kernels.cpu.decide import exp64, prefix_mass, resolve_support
from maskgate.kernels.inputs import SampleInputs
from maskgate.kernels.noise import G_MAX, gumbel, row_keys
from maskgate.kernels.order import GREEDY_T, key_ids, order_keys, pack_keys, scaled_logits
from maskgate.kernels.result import STATUS_OK, STATUS_OVERFLOW, STATUS_TRUNCATED, SampleResult

# Tokens listed per row, tier by tier: rows the first prefix cannot decide (long top-p tails,
# flat rows) retry with a longer one, and only then with a full sort of their keys. 512 covers
# top_k <= 512 and the typical top-p / min-p support of a peaked LM distribution.
PREFIX_TIERS = (512, 4096)


def _tiers(vocab: int) -> list[int]:
    return [t for t in PREFIX_TIERS if t < vocab] + [vocab]


def _first_tier(top_k: torch.Tensor) -> int | None:
    """The prefix that decides every row to resolve when each keeps at most k tokens by top-k
    (top_k: [R], 0 = off): k + 1 rounded up to a power of two (at least 16), unless ties at
    the cut leave fewer listed. The caller tries it first when it is shorter than the usual
    first tier: torch's CPU topk costs about 3x less for 64 than for 512 (49152 logits a
    row)."""
    if top_k.numel() == 0 or not bool((top_k > 0).all()):
        return None
    return max(16, 1 << int(top_k.max()).bit_length())


NEG_INF = float("-inf")
EMPTY_KEY = -(2**63)


def listed_prefix(
    z: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tokens of each row above its length-th largest z, in design order.

    z: [R, V] float32 (NaN-free). Returns ids [R, L] int64 and zs [R, L] float32 (-inf after
    the listed prefix), complete [R] (no finite token unlisted) and z_beyond [R] (an upper
    bound on every unlisted z).
    """
    if length >= z.shape[1]:  # the full sort
        ids = key_ids(order_keys(z).sort(dim=1, descending=True).values)
        zs = z.gather(1, ids)
        return ids, zs, torch.ones(z.shape[0], dtype=torch.bool), zs[:, -1]
    # Unsorted: the keys are sorted below anyway, and torch's CPU topk then skips its own
    # sort of the L values (4096 of 49152 logits: 470 against 707 us a row, one thread).
    vals, idx = z.topk(length, dim=1, sorted=False)  # [R, L]; ties at the cut arbitrary
    t = vals.amin(dim=1)  # the length-th largest z
    above = vals > t[:, None]  # exactly the tokens with z > t, whatever topk did with ties
    keys = torch.where(above, pack_keys(vals, idx), EMPTY_KEY)
    keys = keys.sort(dim=1, descending=True).values
    listed = keys != EMPTY_KEY
    ids = torch.where(listed, key_ids(keys), 0)
    zs = torch.where(listed, z.gather(1, ids), NEG_INF)
    return ids, zs, t == NEG_INF, t


# Up to this many rows the noise keys are hashed on Python ints: about 50 tensor ops of a few
# us each cost more than the hash of a few rows in Python (about 5 us a row).
HOST_KEY_ROWS = 32


def noise_keys(inp: SampleInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row noise keys [B] int64 x2: from (seed, step), else from torch's generator."""
    if inp.seed is None or inp.step is None:
        seed = torch.randint(
            -(2**63), 2**63 - 1, (inp.batch,), dtype=torch.int64, device=inp.logits.device
        )
        step = torch.zeros_like(seed)
    else:
        seed, step = inp.seed, inp.step
    if inp.batch > HOST_KEY_ROWS or seed.device.type != "cpu":
        return row_keys(seed, step)
    words = [row_keys(s, t) for s, t in zip(seed.tolist(), step.tolist(), strict=True)]
    keys = torch.tensor(words, dtype=torch.int64).reshape(-1, 2)
    return keys[:, 0], keys[:, 1]


def draw_from_prefix(
    zs: torch.Tensor,
    ids: torch.Tensor,
    mass: torch.Tensor,
    n: torch.Tensor,
    z_max: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
    greedy: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gumbel-max draw over the first n entries of each sorted prefix.

    zs, ids: [B, L] (float32, int64) in design order; mass: [B, L] float64, exp(z - z_max)
    (resolve.prefix_mass); n, z_max, k0, k1, greedy: [B]. Returns (token [B] int64, logprob [B]
    float32, position of the token in the prefix [B]).
    """
    width = min(int(n.max()), zs.shape[1])  # nothing past the longest support takes part
    zs, ids, mass = zs[:, :width], ids[:, :width], mass[:, :width]
    pos = torch.arange(width, device=zs.device)
    in_s = pos[None, :] < n[:, None]
    score = torch.where(in_s, zs + gumbel(k0[:, None], k1[:, None], ids), NEG_INF)
    j = torch.where(greedy, 0, score.argmax(dim=1))
    token = ids.gather(1, j[:, None]).squeeze(1)
    mass = torch.where(in_s, mass, 0.0)
    lse = z_max.double() + torch.log(mass.sum(dim=1))
    logprob = (zs.gather(1, j[:, None]).squeeze(1).double() - lse).float()
    logprob = torch.where(greedy, 0.0, logprob)
    return token, logprob, j


def draw_whole(
    z: torch.Tensor, z_max: torch.Tensor, z_sum: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gumbel-max over every finite token of each row (S untruncated): (|S|, token, logprob).
    Ties of the score go to the earlier token in design order, as on the Triton path.

    Only tokens that can win get their noise: a token with RN(z + G_MAX) below the score of
    the row's top token (its first, the argmax) scores less than that token, since float32
    rounding is monotone, so it can neither win nor tie."""
    n = torch.full_like(z_max, z.shape[1], dtype=torch.int64)  # |S|: the finite tokens
    holes = z.amin(dim=1) == NEG_INF  # a fast pass; counting a row's -inf costs about five
    if bool(holes.any()):
        n[holes] -= torch.isneginf(z[holes]).sum(dim=1)
    top = z.argmax(dim=1)
    top_score = z_max + gumbel(k0[:, None], k1[:, None], top[:, None]).squeeze(1)
    at = ((z + G_MAX) >= top_score[:, None]).nonzero()  # [N, 2]: row, id
    rows, ids = at[:, 0].contiguous(), at[:, 1].contiguous()
    # One flat index: torch's CPU indexing by two index tensors is several times slower.
    zc = z.view(-1).index_select(0, rows * z.shape[1] + ids)
    score = zc + gumbel(k0.index_select(0, rows), k1.index_select(0, rows), ids)
    best = torch.full_like(z_max, NEG_INF).scatter_reduce(0, rows, score, "amax")
    keys = torch.where(score == best.index_select(0, rows), pack_keys(zc, ids), EMPTY_KEY)
    token = key_ids(torch.full_like(n, EMPTY_KEY).scatter_reduce(0, rows, keys, "amax"))
    z_tok = z.gather(1, token[:, None]).squeeze(1)
    return n, token, (z_tok.double() - (z_max.double() + torch.log(z_sum))).float()


# The pass over whole rows (scale, max, normaliser, the first tier's top-k) goes a block of
# rows at a time, about this many logits a block, so that its temporaries (float64 among them)
# stay in cache and in memory the allocator reuses: at B = 64 and V = 49152, the whole batch at
# once allocated 12-25 MB a temporary and took about twice as long on one thread.
ROW_BLOCK = 1 << 17


def _row_blocks(batch: int, vocab: int) -> list[tuple[int, int]]:
    step = max(1, ROW_BLOCK // vocab)
    return [(s, min(s + step, batch)) for s in range(0, batch, step)]


def _row_z(x: torch.Tensor, temperature: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """z, z_max and nan_rows of a block of rows; a bad row's z and z_max are zeroed (its
    results are overridden) to keep the arithmetic finite."""
    # IEEE float32 division, greedy rows unscaled, and -0.0 folded to 0.0: equal
    # z tie on the id, and the full sort's order keys would put -0.0 after 0.0.
    if bool((temperature == 1.0).all()):  # x / 1 is x: one pass (the fold) instead of two
        z = x.float() + 0.0
    else:
        z = scaled_logits(x.float(), temperature)
    z_max = z.amax(dim=1)  # NaN propagates through amax
    # A NaN or +inf anywhere (also a z that overflowed), or no finite logit: never sampled.
    bad = torch.isnan(z_max) | (z_max == NEG_INF) | (z_max == float("inf"))
    if bool(bad.any()):
        z = z.masked_fill(bad[:, None], 0.0)
        z_max = z_max.masked_fill(bad, 0.0)
    return z, z_max, bad


def sample_torch(inp: SampleInputs) -> SampleResult:
    """kernels.sample for CPU tensors (any device works; the CUDA path is the Triton one)."""
    x = inp.logits  # [B, V]
    batch, vocab = x.shape
    greedy = inp.temperature.double() < GREEDY_T
    top_k = inp.top_k.to(torch.int64)
    top_k = torch.where((top_k > 0) & (top_k < vocab), top_k, 0)
    k0, k1 = noise_keys(inp)
    cap = min(inp.max_mask_tokens, vocab)
    n = torch.ones(batch, dtype=torch.int64)
    token = torch.zeros(batch, dtype=torch.int64)
    logprob = torch.zeros(batch, dtype=torch.float32)
    j = torch.zeros(batch, dtype=torch.int64)
    padded = torch.zeros(batch, cap, dtype=torch.int64)  # first cap ids of each row
    fallback = torch.zeros(batch, dtype=torch.bool)
    z_max = torch.zeros(batch, dtype=torch.float32)
    z_sum = torch.zeros(batch, dtype=torch.float64)  # only where needs_sum (below)
    nan_rows = torch.zeros(batch, dtype=torch.bool)
    # Rows nothing truncates and that want no mask (a general pool's plain sampling): S is
    # every finite token, so they need no prefix: one Gumbel-max over the row.
    whole = ~greedy & (top_k == 0) & (inp.top_p >= 1.0) & (inp.min_p <= 0.0)
    whole &= ~inp.want_mask.to(whole.device)
    # The normaliser over the whole row (a float64 exp of every logit, the costliest pass after
    # the top-k) serves top-p without top-k and the plain rows' log-prob only: top-k rows
    # normalise over their k listed tokens, min-p needs none, and a log-prob is taken over S.
    needs_sum = whole | ((top_k == 0) & (inp.top_p < 1.0))
    tiers = _tiers(vocab)
    usual_first = tiers[0]  # rows that need more than this count as fallback rows
    first = _first_tier(top_k[~greedy & ~whole])
    if first is not None and first < usual_first:
        tiers.insert(0, first)
    listed = []  # the first tier's prefixes of the rows left to resolve, block by block
    for s, e in _row_blocks(batch, vocab):
        z, z_max[s:e], bad = _row_z(x[s:e], inp.temperature[s:e])
        nan_rows[s:e] = bad
        if bool(needs_sum[s:e].any()):
            z_sum[s:e] = exp64(z - z_max[s:e, None]).sum(dim=1)  # top-p's normaliser without k
        g = greedy[s:e] & ~bad
        if bool(g.any()):  # greedy: argmax, lowest id among ties (torch's first max)
            r = g.nonzero().squeeze(1)  # in the block; s + r in the batch
            token[s + r] = z[r].argmax(dim=1)
            padded[s + r, 0] = token[s + r]
        w = whole[s:e] & ~bad
        if bool(w.any()):
            r = w.nonzero().squeeze(1)
            b = s + r
            n[b], token[b], logprob[b] = draw_whole(z[r], z_max[b], z_sum[b], k0[b], k1[b])
        rest = ~greedy[s:e] & ~bad & ~whole[s:e]
        if bool(rest.any()):
            listed.append(listed_prefix(z if bool(rest.all()) else z[rest], tiers[0]))
    whole &= ~nan_rows
    rows = (~greedy & ~nan_rows & ~whole).nonzero().squeeze(1)
    out = _Rows(n, token, logprob, j, padded, fallback)
    _resolve_tiers(inp, rows, (tiers, usual_first), listed, top_k, (z_max, z_sum), (k0, k1), out)

    n = torch.where(nan_rows, 0, n)
    token = torch.where(nan_rows, 0, token)
    logprob = torch.where(nan_rows, float("nan"), logprob)
    return emit_masks(inp, token, logprob, n, j, padded, nan_rows, fallback)


@dataclass(frozen=True)
class _Rows:
    """sample_torch's per-row outputs, filled in place: n, token, logprob, j (the token's
    position in design order), fallback [B]; padded [B, cap], each row's first cap ids."""

    n: torch.Tensor
    token: torch.Tensor
    logprob: torch.Tensor
    j: torch.Tensor
    padded: torch.Tensor
    fallback: torch.Tensor


def _resolve_tiers(
    inp: SampleInputs,
    rows: torch.Tensor,
    tiers: tuple[list[int], int],
    listed: Sequence[tuple[torch.Tensor, ...]],
    top_k: torch.Tensor,
    sums: tuple[torch.Tensor, torch.Tensor],
    keys: tuple[torch.Tensor, torch.Tensor],
    out: _Rows,
) -> None:
    """The rows left to resolve (rows: [R] batch indices), tier by tier: each tier's prefix
    decides |S| and draws, and the rows it cannot decide go on to the next, longer one.

    tiers: (the prefix lengths, the usual first one: rows past it count as fallback rows);
    listed: the first tier's prefixes, block by block; top_k [B] (0 = off); sums: (z_max,
    z_sum) [B]; keys: the noise keys (k0, k1) [B]."""
    x = inp.logits
    lengths, usual_first = tiers
    z_max, z_sum = sums
    k0, k1 = keys
    cap = out.padded.shape[1]
    for tier, length in enumerate(lengths):
        if rows.numel() == 0:
            break
        if tier > 0:
            if length > usual_first:
                out.fallback[rows] = True
            z, _, _ = _row_z(x[rows], inp.temperature[rows])  # only these rows: no bad one
            ids, zs, complete, z_beyond = listed_prefix(z, length)
        else:
            ids, zs, complete, z_beyond = (torch.cat(parts) for parts in zip(*listed, strict=True))
        params = (top_k[rows], inp.top_p[rows], inp.min_p[rows])
        zm = z_max[rows]
        mass = prefix_mass(zs, zm)
        r_n, more = resolve_support(zs, mass, complete, z_beyond, zm, z_sum[rows], *params)
        no = torch.zeros_like(more)
        r_tok, r_lp, r_j = draw_from_prefix(zs, ids, mass, r_n, zm, k0[rows], k1[rows], no)
        done = ~more
        d_rows = rows[done]
        out.n[d_rows], out.token[d_rows], out.logprob[d_rows], out.j[d_rows] = (
            r_n[done],
            r_tok[done],
            r_lp[done],
            r_j[done],
        )
        width = min(cap, length)
        out.padded[d_rows, :width] = ids[done, :width]
        rows = rows[more]


def emit_masks(
    inp: SampleInputs,
    token: torch.Tensor,
    logprob: torch.Tensor,
    n: torch.Tensor,
    j: torch.Tensor,
    padded: torch.Tensor,
    nan_rows: torch.Tensor,
    fallback: torch.Tensor,
) -> SampleResult:
    """Packs the masks of the requesting rows as CSR (docs/design.md, mask semantics).

    padded: [B, cap] int64, each row's first cap ids in design order.
    """
    cap = padded.shape[1]
    rows = inp.want_mask.nonzero().squeeze(1).to(padded.device)  # [R]
    n_r, bounded = n[rows], inp.bounded[rows]
    over = n_r > inp.max_mask_tokens
    count = torch.where(over, torch.where(bounded, cap, 0), n_r)
    status = torch.where(over, torch.where(bounded, STATUS_TRUNCATED, STATUS_OVERFLOW), STATUS_OK)
    ids = padded[rows]
    # Bounded mode: y replaces the last id when it is not among the first C.
    swap = over & bounded & (j[rows] >= cap)
    ids[swap, cap - 1] = token[rows][swap]
    keep = torch.arange(cap)[None, :] < count[:, None]
    offsets = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(count, dim=0)
    return SampleResult(
        tokens=token,
        logprobs=logprob.to(torch.float32),
        mask_rows=rows,
        mask_offsets=offsets,
        mask_ids=ids[keep].to(torch.int32),
        mask_status=status.to(torch.int8),
        nan_rows=nan_rows,
        fallback_rows=fallback,
        support_sizes=n.to(torch.int64),
    )

"""Support size from a sorted prefix of the design order (torch; the CPU path's core).

Given the first L tokens of a row in design order, decide |S| exactly or report that the
prefix is too short to decide. The Triton resolve kernel implements the same rules.
"""

from __future__ import annotations

import torch


def exp64(d: torch.Tensor) -> torch.Tensor:
    """exp of a float32 difference (z - z_max, rounded in float32 as on the CUDA path), taken
    in float64. torch's float32 exp on the CPU (torch 2.13) gave sums 2e-5 apart (relative) on
    the first call of about one process in four, against 2e-10 in float64: enough to move a
    log-prob past the 1e-5 the design allows, or a top-p cut near its boundary."""
    return torch.exp(d.double())


def prefix_mass(zs: torch.Tensor, z_max: torch.Tensor) -> torch.Tensor:
    """exp(z - z_max) [B, L] float64 of a listed prefix (zs [B, L], -inf past it: mass 0)."""
    return exp64(zs - z_max[:, None])


def resolve_support(
    zs: torch.Tensor,
    mass: torch.Tensor,
    complete: torch.Tensor,
    z_beyond: torch.Tensor,
    z_max: torch.Tensor,
    z_sum: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Support size n and need_more, both [B].

    zs:        [B, L] float32, z of the first L tokens in design order; -inf marks the end
               (entries after the first -inf are ignored).
    mass:      [B, L] float64, prefix_mass(zs, z_max).
    complete:  [B] bool, True when no finite token lies beyond the listed ones.
    z_beyond:  [B] float32, an upper bound on z of every unlisted token.
    z_max:     [B] float32, the row maximum of z.
    z_sum:     [B] float64, sum over all finite tokens of exp(z - z_max).
    top_k:     [B] int, 0 = off (already mapped from -1 and from k >= V).
    need_more: the prefix cannot decide |S|; n is then meaningless.
    """
    batch, length = zs.shape
    vocab_k = top_k.to(torch.int64)
    pos = torch.arange(length, device=zs.device)
    listed = (zs > float("-inf")).cumprod(dim=1).bool()  # [B, L]
    n_listed = listed.sum(dim=1)  # [B]
    big = torch.full_like(n_listed, length + 1)  # "beyond the listed prefix"

    # top-k. The caller maps top_k outside (0, V) to 0 (off); a k beyond the
    # finite tokens of a complete row keeps them all.
    k_on = vocab_k > 0
    k_known = ~k_on | complete | (vocab_k <= n_listed)
    cut_k = torch.where(k_on, torch.minimum(vocab_k, n_listed), n_listed)
    cut_k = torch.where(k_known, cut_k, big)
    cut_k = torch.where(~k_on & ~complete, big, cut_k)

    # Masses relative to the row max, zero past the listed prefix; accumulated in float64 so
    # long top-p prefixes stay far from the float32 rounding the oracle calls ambiguous.
    mass = torch.where(listed, mass, 0.0)
    in_k = pos[None, :] < torch.minimum(cut_k, n_listed)[:, None]
    z_norm = torch.where(k_on, (mass * in_k).sum(dim=1), z_sum.double())

    # top-p: keep j iff the mass strictly before j is < top_p.
    p_on = top_p < 1.0
    before = torch.cumsum(mass, dim=1) - mass
    keep_p = listed & (before / z_norm[:, None] < top_p.double()[:, None])
    cut_p = keep_p.sum(dim=1)
    mass_listed = mass.sum(dim=1)
    next_kept = mass_listed / z_norm < top_p.double()  # the first unlisted token is kept
    p_known = complete | (cut_p < n_listed) | ~next_kept
    cut_p = torch.where(p_known, cut_p, big)
    # A top-p cut needs the top-k normaliser: unknown when the k-th token is unlisted.
    p_blind = p_on & k_on & ~k_known

    n = torch.minimum(cut_k, torch.where(p_on, cut_p, big))
    m_on = min_p > 0
    if bool(m_on.any()):
        # min-p in float64, so the test does not hinge on float32 exp rounding.
        min_p64 = min_p.double()[:, None]
        rel = torch.exp(zs.double() - z_max.double()[:, None])
        cut_m = (listed & (rel >= min_p64)).sum(dim=1)
        beyond_passes = torch.exp(z_beyond.double() - z_max.double()) >= min_p.double()
        m_known = complete | (cut_m < n_listed) | ~beyond_passes
        cut_m = torch.where(m_known, cut_m, big)
        n = torch.minimum(n, torch.where(m_on, cut_m, big))
    n = torch.where(complete, torch.minimum(n, n_listed), n)
    need_more = (n > n_listed) | p_blind
    n = torch.clamp(n, min=1)  # at least one token is always kept
    assert n.shape == (batch,)
    return n, need_more

"""Float64, sort-based oracle of the mask semantics (docs/design.md). Tests only: it sorts the
whole vocabulary.

z is formed in float32 exactly as the design says (round-to-nearest division); everything
after that (order, masses, cumulative sums, min-p test) is float64. A row is flagged
`ambiguous` when its support hinges on a top-p boundary within AMBIGUITY_TOL of top_p, but not
exactly on it (float32 kernels may then legitimately decide either way), or on a min-p
boundary within a few float64 ulps.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from maskgate.kernels.order import GREEDY_T, scaled_logits

# Float32 masses and sums (2**18 terms, approximate exp on GPUs) stay within about 3e-7 of the
# float64 fractions; 2e-6 leaves margin without flagging rows that float32 decides reliably.
AMBIGUITY_TOL = 2e-6
MIN_P_TOL = 1e-12
# Rows are checked in blocks of about this many elements: the check holds some fifteen [rows, V]
# float64 temporaries, 17 GB at B = 512, V = 262144 in one block, about 1 GB in blocks.
BLOCK_ELEMENTS = 1 << 23


@dataclass(frozen=True)
class Reference:
    order: torch.Tensor  # [B, V] int64, token ids in design order
    z: torch.Tensor  # [B, V] float64, z (from float32) in design order
    support_sizes: torch.Tensor  # [B] int64, |S| (0 for NaN rows)
    log_norm: torch.Tensor  # [B] float64, logsumexp of z over S
    ambiguous: torch.Tensor  # [B] bool
    nan_rows: torch.Tensor  # [B] bool
    greedy: torch.Tensor  # [B] bool

    def support(self, row: int) -> list[int]:
        return self.order[row, : int(self.support_sizes[row])].tolist()

    def logprob(self, row: int, token: int) -> float:
        """Log-prob of token under the truncated distribution (0.0 for greedy rows)."""
        if bool(self.greedy[row]):
            return 0.0
        pos = (self.order[row] == token).nonzero()
        return float(self.z[row, int(pos[0, 0])] - self.log_norm[row])

    def probs(self, row: int) -> torch.Tensor:
        """[|S|] float64, the truncated renormalised probabilities in design order."""
        n = int(self.support_sizes[row])
        return torch.softmax(self.z[row, :n], dim=0)


def reference(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> Reference:
    """logits: [B, V]; temperature/top_p/min_p: [B] float32; top_k: [B] int (-1/0 off).

    Rows are independent: a batch of more than one block is checked a block at a time."""
    batch, vocab = logits.shape
    step = max(1, BLOCK_ELEMENTS // max(vocab, 1))
    if batch > step:
        args = (logits, temperature, top_k, top_p, min_p)
        parts = [reference(*(a[lo : lo + step] for a in args)) for lo in range(0, batch, step)]
        return Reference(
            *(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(Reference))
        )
    x = logits.float()
    greedy = temperature.double() < GREEDY_T
    z32 = scaled_logits(x, temperature)
    nan_rows = (
        torch.isnan(z32).any(dim=1)
        | ~(z32 > float("-inf")).any(dim=1)
        | torch.isposinf(z32).any(dim=1)
    )
    z32 = z32.masked_fill(nan_rows[:, None], 0.0)
    zs, order = torch.sort(z32.double(), dim=1, descending=True, stable=True)
    pos = torch.arange(vocab, device=x.device)[None, :]
    finite = zs > float("-inf")
    n_finite = finite.sum(dim=1)
    z_max = zs[:, :1]
    mass = torch.where(finite, torch.exp(zs - z_max), 0.0)

    k = top_k.to(torch.int64)
    k_on = (k > 0) & (k < vocab)
    cut_k = torch.where(k_on, torch.minimum(k, n_finite), n_finite)
    in_k = pos < cut_k[:, None]
    mass_k = mass * in_k
    norm = mass_k.sum(dim=1, keepdim=True)
    frac_before = (torch.cumsum(mass_k, dim=1) - mass_k) / norm  # [B, V]
    p = top_p.double()[:, None]
    p_on = top_p < 1.0
    cut_p = torch.where(p_on, (in_k & (frac_before < p)).sum(dim=1), n_finite)
    rel = torch.exp(zs - z_max)
    m = min_p.double()[:, None]
    m_on = min_p > 0
    cut_m = torch.where(m_on, (finite & (rel >= m)).sum(dim=1), n_finite)
    n = torch.minimum(torch.minimum(cut_k, cut_p), cut_m).clamp(min=1)
    n = torch.where(greedy, 1, n)

    # Ambiguity: the binding top-p boundary (last kept / first dropped) lies within tolerance.
    binding_p = p_on & ~greedy & (cut_p <= torch.minimum(cut_k, cut_m))
    # An exact hit (frac == p, e.g. tied masses of exactly 1.0) is decided the same way by
    # float32 arithmetic, which is exact there too; only near misses are ambiguous.
    gap_p = (frac_before - p).abs()
    near_p = (gap_p > 0) & (gap_p <= AMBIGUITY_TOL)
    at_p = (pos == cut_p[:, None]) | (pos == cut_p[:, None] - 1)
    amb_p = binding_p & (near_p & at_p & in_k).any(dim=1)
    binding_m = m_on & ~greedy & (cut_m <= torch.minimum(cut_k, cut_p))
    gap_m = (rel - m).abs()
    near_m = (gap_m > 0) & (gap_m <= MIN_P_TOL * m)
    at_m = (pos == cut_m[:, None]) | (pos == cut_m[:, None] - 1)
    amb_m = binding_m & (near_m & at_m & finite).any(dim=1)

    in_s = pos < n[:, None]
    log_norm = zs[:, 0] + torch.log(torch.where(in_s, mass, 0.0).sum(dim=1))
    n = torch.where(nan_rows, 0, n)
    return Reference(
        order=order,
        z=zs,
        support_sizes=n,
        log_norm=log_norm,
        ambiguous=(amb_p | amb_m) & ~nan_rows,
        nan_rows=nan_rows,
        greedy=greedy,
    )

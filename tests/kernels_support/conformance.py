"""Checks a SampleResult against the float64 oracle (the kernel tests, CPU and GPU).

Everything is compared on the host; this is slow by design and never on the serving path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from maskgate.kernels.reference import Reference
from maskgate.kernels.result import STATUS_OK, STATUS_OVERFLOW, STATUS_TRUNCATED, SampleResult

LOGPROB_TOL = 1e-5


@dataclass
class Conformance:
    rows: int = 0
    ambiguous: int = 0
    support_mismatch: int = 0  # non-ambiguous rows whose |S| or mask differs from the oracle
    token_outside: int = 0  # sampled token not in the oracle support (non-ambiguous rows)
    logprob_max_err: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def fail(self, msg: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(msg)


def check_result(
    res: SampleResult,
    ref: Reference,
    want_mask: torch.Tensor,
    bounded: torch.Tensor | None,
    max_mask_tokens: int,
) -> Conformance:
    """Support equality (except ambiguous rows), CSR invariants, log-probs, token in mask."""
    out = Conformance()
    batch, vocab = ref.order.shape
    dev = ref.order.device
    tokens_t = res.tokens.to(dev)
    # Position of each sampled token in the oracle order, and its oracle log-prob.
    inverse = torch.empty_like(ref.order)
    inverse.scatter_(1, ref.order, torch.arange(vocab, device=dev).expand(batch, -1))
    tok_pos = inverse.gather(1, tokens_t.clamp(0, vocab - 1)[:, None]).squeeze(1)
    ref_lp_t = ref.z.gather(1, tok_pos[:, None]).squeeze(1) - ref.log_norm
    ref_lp = torch.where(ref.greedy, 0.0, ref_lp_t).cpu().tolist()
    tok_pos_l = tok_pos.cpu().tolist()
    ref_sizes = ref.support_sizes.cpu().tolist()
    ambiguous = ref.ambiguous.cpu().tolist()
    ref_nan = ref.nan_rows.cpu().tolist()
    tokens = res.tokens.cpu().tolist()
    logprobs = res.logprobs.double().cpu().tolist()
    sizes = res.support_sizes.cpu().tolist()
    nan_rows = res.nan_rows.cpu().tolist()
    bounded_l = [False] * batch if bounded is None else bounded.cpu().tolist()
    rows = res.mask_rows.cpu().tolist()
    offsets = res.mask_offsets.cpu().tolist()
    status = res.mask_status.cpu().tolist()
    ids = res.mask_ids.cpu().tolist()
    if rows != want_mask.nonzero().squeeze(1).tolist():
        out.fail(f"mask_rows {rows[:8]} are not the requesting rows in ascending order")
    if len(offsets) != len(rows) + 1 or offsets[0] != 0 or len(status) != len(rows):
        out.fail("CSR shape: offsets must be [R+1] from 0 and status [R]")
        return out
    if any(b < a for a, b in itertools.pairwise(offsets)) or offsets[-1] > len(ids):
        out.fail("CSR offsets must be non-decreasing and within mask_ids")
        return out
    segment = {r: ids[offsets[i] : offsets[i + 1]] for i, r in enumerate(rows)}
    seg_status = dict(zip(rows, status, strict=True))
    for b in range(batch):
        out.rows += 1
        if ref_nan[b] != nan_rows[b]:
            out.fail(f"row {b}: nan flag {nan_rows[b]} != oracle {ref_nan[b]}")
            continue
        if nan_rows[b]:
            if segment.get(b):
                out.fail(f"row {b}: flagged row emitted ids")
            continue
        if ambiguous[b]:
            out.ambiguous += 1
            _check_own_consistency(out, b, tokens[b], sizes[b], segment.get(b), vocab)
            continue
        n = ref_sizes[b]
        if sizes[b] != n:
            out.support_mismatch += 1
            out.fail(f"row {b}: |S| {sizes[b]} != oracle {n}")
            continue
        if not 0 <= tokens[b] < vocab or tok_pos_l[b] >= n:
            out.token_outside += 1
            out.fail(f"row {b}: token {tokens[b]} outside the oracle support")
            continue
        err = abs(logprobs[b] - ref_lp[b])
        out.logprob_max_err = max(out.logprob_max_err, err)
        if not err <= LOGPROB_TOL:
            out.fail(f"row {b}: logprob error {err:.3g}")
        if b in segment:
            head = ref.order[b, : min(n, max_mask_tokens)].tolist()
            _check_mask(
                out,
                b,
                segment[b],
                seg_status[b],
                head,
                n,
                tokens[b],
                bounded_l[b],
                max_mask_tokens,
            )
    return out


def _check_mask(
    out: Conformance,
    b: int,
    seg: list[int],
    status: int,
    head: list[int],
    size: int,
    token: int,
    bounded: bool,
    cap: int,
) -> None:
    """head: the oracle's first min(|S|, C) ids; size: |S|."""
    if size <= cap:
        expect, want_status = head, STATUS_OK
    elif not bounded:
        expect, want_status = [], STATUS_OVERFLOW
    else:
        expect, want_status = list(head), STATUS_TRUNCATED
        if token not in set(expect):
            expect[-1] = token
    if status != want_status:
        out.fail(f"row {b}: status {status} != {want_status} (|S|={size}, C={cap})")
    elif seg != expect:
        out.support_mismatch += 1
        out.fail(f"row {b}: mask differs from the oracle (len {len(seg)} vs {len(expect)})")
    elif want_status != STATUS_OVERFLOW and token not in set(seg):
        out.fail(f"row {b}: token {token} not in its mask")


def _check_own_consistency(
    out: Conformance, b: int, token: int, size: int, seg: list[int] | None, vocab: int
) -> None:
    """Ambiguous rows: the kernel may cut either way, but its own outputs must agree."""
    if not 1 <= size <= vocab:
        out.fail(f"row {b}: ambiguous row with |S| = {size}")
    if seg and len(seg) == size and token not in set(seg):
        out.fail(f"row {b}: token {token} not in its own mask")

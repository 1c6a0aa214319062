"""Checks a SampleResult against the float64 oracle (used by the tests and the benchmark).

Everything is compared on the host; this is slow by design and never on the serving path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from kernels.reference import Reference
from kernels.result import STATUS_OK, STATUS_OVERFLOW, STATUS_TRUNCATED, SampleResult

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
    batch = ref.support_sizes.shape[0]
    tokens = res.tokens.cpu().tolist()
    logprobs = res.logprobs.double().cpu()
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
    vocab = ref.order.shape[1]
    for b in range(batch):
        out.rows += 1
        if bool(ref.nan_rows[b]) != nan_rows[b]:
            out.fail(f"row {b}: nan flag {nan_rows[b]} != oracle {bool(ref.nan_rows[b])}")
            continue
        if nan_rows[b]:
            if segment.get(b):
                out.fail(f"row {b}: flagged row emitted ids")
            continue
        if bool(ref.ambiguous[b]):
            out.ambiguous += 1
            _check_own_consistency(out, b, tokens[b], sizes[b], segment.get(b), vocab)
            continue
        support = ref.support(b)
        if sizes[b] != len(support):
            out.support_mismatch += 1
            out.fail(f"row {b}: |S| {sizes[b]} != oracle {len(support)}")
            continue
        if tokens[b] not in set(support):
            out.token_outside += 1
            out.fail(f"row {b}: token {tokens[b]} outside the oracle support")
            continue
        err = abs(float(logprobs[b]) - ref.logprob(b, tokens[b]))
        out.logprob_max_err = max(out.logprob_max_err, err)
        if not err <= LOGPROB_TOL:
            out.fail(f"row {b}: logprob error {err:.3g}")
        if b in segment:
            _check_mask(
                out, b, segment[b], seg_status[b], support, tokens[b], bounded_l[b], max_mask_tokens
            )
    return out


def _check_mask(
    out: Conformance,
    b: int,
    seg: list[int],
    status: int,
    support: list[int],
    token: int,
    bounded: bool,
    cap: int,
) -> None:
    if len(support) <= cap:
        expect, want_status = support, STATUS_OK
    elif not bounded:
        expect, want_status = [], STATUS_OVERFLOW
    else:
        expect, want_status = list(support[:cap]), STATUS_TRUNCATED
        if token not in set(expect):
            expect[-1] = token
    if status != want_status:
        out.fail(f"row {b}: status {status} != {want_status} (|S|={len(support)}, C={cap})")
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

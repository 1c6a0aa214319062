"""kernels.sample rejects malformed arguments with a clear TypeError / ValueError."""

from __future__ import annotations

import pytest
import torch

from maskgate import kernels
from maskgate.kernels.inputs import check_inputs


def good(batch: int = 3, vocab: int = 20) -> dict:
    ones = torch.ones(batch)
    return {
        "logits": torch.randn(batch, vocab),
        "temperature": ones.clone(),
        "top_k": torch.full((batch,), -1, dtype=torch.int32),
        "top_p": ones * 0.9,
        "min_p": ones * 0.0,
        "want_mask": torch.ones(batch, dtype=torch.bool),
        "max_mask_tokens": 16,
    }


def call(**kw):
    kw = {**good(), **kw}
    return kernels.sample(
        kw.pop("logits"),
        kw.pop("temperature"),
        kw.pop("top_k"),
        kw.pop("top_p"),
        kw.pop("min_p"),
        kw.pop("want_mask"),
        **kw,
    )


def test_good_arguments_pass() -> None:
    assert call().tokens.shape == (3,)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"logits": [[1.0, 2.0]]}, TypeError, "logits must be a torch.Tensor"),
        ({"logits": torch.zeros(3, 20, dtype=torch.float64)}, TypeError, "logits must be"),
        ({"logits": torch.zeros(3, 20, 1)}, ValueError, r"shape \[B, V\]"),
        ({"logits": torch.zeros(0, 20)}, ValueError, "B >= 1"),
        ({"logits": torch.zeros(20, 3).t()}, ValueError, "contiguous"),
        ({"temperature": torch.ones(4)}, ValueError, r"temperature must have shape \[3\]"),
        ({"temperature": torch.ones(3, dtype=torch.float64)}, TypeError, "temperature must"),
        ({"top_k": torch.ones(3, dtype=torch.int64)}, TypeError, "top_k must have dtype"),
        ({"top_p": torch.ones(3, 1)}, ValueError, "top_p must have shape"),
        ({"min_p": torch.ones(3, device="meta")}, ValueError, "min_p must be on cpu"),
        ({"want_mask": torch.ones(3)}, TypeError, "want_mask must have dtype torch.bool"),
        ({"max_mask_tokens": 0}, ValueError, "max_mask_tokens must be >= 1"),
        ({"max_mask_tokens": 4.0}, TypeError, "max_mask_tokens must be an int"),
        ({"max_mask_tokens": True}, TypeError, "max_mask_tokens must be an int"),
        ({"step": torch.zeros(3, dtype=torch.int64)}, ValueError, "step was given without seed"),
        ({"seed": torch.zeros(3, dtype=torch.int32)}, TypeError, "seed must have dtype"),
        ({"bounded": torch.zeros(2, dtype=torch.bool)}, ValueError, "bounded must have shape"),
    ],
)
def test_bad_arguments_raise(changes: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call(**changes)


def test_left_out_bounded_and_step_share_read_only_zeros() -> None:
    """bounded and step default to zeros that neither path writes: one buffer, no fill a call."""
    a = check_inputs(**{**good(3), "seed": torch.arange(3)})
    b = check_inputs(**{**good(5), "seed": torch.arange(5)})
    assert a.bounded.dtype == torch.bool and a.bounded.shape == (3,) and not a.bounded.any()
    assert b.step.dtype == torch.int64 and b.step.shape == (5,) and not b.step.any()
    assert a.bounded.data_ptr() == b.bounded.data_ptr() and a.step.data_ptr() == b.step.data_ptr()
    assert a.bounded.data_ptr() % 16 == 0  # Triton specialises pointers on 16-byte alignment
    res = call(seed=torch.arange(3))
    assert res.tokens.shape == (3,) and not a.bounded.any() and not a.step.any()

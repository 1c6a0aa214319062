"""MaskIdsCopy on CUDA (maskgate/worker/runner/mask_copy.py): a step's ids through the pinned
staging buffer, right at every size as the buffer is reused and regrown."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from maskgate.worker.runner.mask_copy import MaskIdsCopy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_each_step_copies_its_ids() -> None:
    copier = MaskIdsCopy(torch.device("cuda"))
    gen = torch.Generator().manual_seed(0)
    for n in (5, 70_000, 3, 0, 200_000):  # past the first capacity: the buffer regrows
        ids = torch.randint(0, 151_936, (n + 17,), generator=gen, dtype=torch.int32)
        host = copier.copy(ids.cuda(), n)
        assert host.dtype == np.int32 and host.shape == (n,)
        np.testing.assert_array_equal(host, ids[:n].numpy())

"""RowSampler for tests that compare whole RowResults with plain_sample's (tests/conftest.py):
the worker keeps each mask as an int32 NumPy array (maskgate/worker/runner/mask_copy.py), the
reference as a list."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from maskgate.worker.engine.batch import RowWork
from maskgate.worker.runner.row_sampling import RowSampler


class ListedSampler(RowSampler):
    """RowSampler with each mask as a list (checked to be an int32 array first)."""

    def sample(self, logits: torch.Tensor, rows: list[RowWork]) -> Any:
        results, seconds, fallback = super().sample(logits, rows)
        for r in results:
            if r.mask is not None:
                assert isinstance(r.mask, np.ndarray) and r.mask.dtype == np.int32
                r.mask = r.mask.tolist()
        return results, seconds, fallback

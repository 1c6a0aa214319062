"""Unpack `sampling_mask_format: "packed"` masks with NumPy, as a trainer would.

    python examples/unpack_masks.py http://127.0.0.1:8000

asks the gateway (or a worker) for one packed-mask answer on /generate and prints each
token's mask. A trainer needs only `unpack`: its arrays feed a boolean [T, vocab] mask or
a gather without a Python list per token.
"""

from __future__ import annotations

import base64
import json
import sys
import urllib.request
from typing import Any

import numpy as np


def unpack(meta_info: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """meta_info -> (ids [N] int32, offsets [T + 1] int32); token t's mask is
    ids[offsets[t]:offsets[t + 1]], ascending."""
    ids = np.frombuffer(base64.b64decode(meta_info["output_token_sampling_mask_ids"]), "<i4")
    offsets = np.frombuffer(
        base64.b64decode(meta_info["output_token_sampling_mask_offsets"]), "<i4"
    )
    return ids, offsets


def dense(ids: np.ndarray, offsets: np.ndarray, vocab_size: int) -> np.ndarray:
    """A boolean [T, vocab_size] mask: True where the sampler could have drawn the id."""
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    out = np.zeros((len(offsets) - 1, vocab_size), dtype=bool)
    out[rows, ids] = True
    return out


def main(base_url: str) -> None:
    body = {
        "text": "The capital of France is",
        "sampling_params": {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 8},
        "return_sampling_mask": True,
        "sampling_mask_format": "packed",
    }
    req = urllib.request.Request(
        base_url.rstrip("/") + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        meta = json.load(resp)["meta_info"]
    ids, offsets = unpack(meta)
    for t in range(len(offsets) - 1):
        print(t, ids[offsets[t] : offsets[t + 1]].tolist())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")

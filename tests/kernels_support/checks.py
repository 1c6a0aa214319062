"""The interpreted kernel checks' shared parts (tests/unit/kernels/test_kernels_*.py): the
prelude most of their scripts start with, and `patch`, with which a script counts or replaces
a device function under the interpreter.

Under TRITON_INTERPRET=1 a @triton.jit function calls another by looking its name up in its
own module's globals at each call, so a script patches the module of the caller: the module a
phase's code lives in, not the one that defines the function it calls.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

# The prelude of the checks that run whole launches: both paths on one batch, the Triton
# path with a shrunken band (64-token segments, 8 candidates a segment).
PRELUDE = """
import itertools, json, sys
import torch
from kernels_support.checks import patch
from kernels_support.conformance import check_result
from maskgate.kernels.inputs import check_inputs
from maskgate.kernels.reference import reference
from maskgate.kernels.cpu.torch_path import sample_torch
from maskgate.kernels.triton.config import band_config
from maskgate.kernels.triton.launch import sample_triton
from kernels_support.workloads import ADVERSARIAL_KINDS, adversarial_logits

REREAD = False  # lanes with three tokens in the band read their column again

def both(logits, temp, k, p, mp, want, cap, seed=None, step=None, bounded=None, lanes=16):
    inp = check_inputs(logits, temp, k, p, mp, want, max_mask_tokens=cap, seed=seed,
                       step=step, bounded=bounded)
    cfg = band_config(logits.shape[1], chunk=64, kc=8, lanes=lanes, reread=REREAD)
    return sample_triton(inp, cfg), sample_torch(inp)
"""


def patch(module: ModuleType, name: str, value: Any) -> Any:
    """Sets module.name to value and returns what it was. The name must be a global of the
    module already: a patch of a name the module's code does not call would check nothing."""
    if name not in vars(module):
        raise AttributeError(f"{module.__name__} has no global {name!r} to patch")
    old = vars(module)[name]
    setattr(module, name, value)
    return old

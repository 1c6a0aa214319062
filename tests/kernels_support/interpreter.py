"""Faster runs of kernels under Triton's interpreter (TRITON_INTERPRET=1, on the CPU).

The interpreter reduces with numpy when the combine function is one of Triton's own (sum, max,
argmax), but any other combine function, such as the tuple reductions of
maskgate/kernels/triton/common.py, it applies one element at a time in Python: 96% of an
interpreted resolve launch. `install()` replaces that element loop with a pairwise tree over
whole blocks: each level combines the even and the odd positions along the axis with one call
of the combine function on blocks, so a reduction of n elements costs about log2(n) vectorised
calls instead of n scalar ones.

Pairs are adjacent (2i, 2i + 1), so each partial result covers a contiguous run and operands
keep their order: the result is exact for any associative combine function, commutative or not,
like the interpreter's left fold. Block sizes are powers of two in Triton; any other length
keeps the loop. Float sums are grouped as a tree instead of a fold, as a GPU groups them.

It also patches triton.language once a launch instead of at every helper call
(`_patch_lang_once`), and makes a launch with a keyword that is neither the kernel's
parameter nor a compile option fail (`_strict_launch`), as a compiled launch does: the
interpreter drops such keywords without a word, so a launch the GPU refuses passed on the
CPU. The interpreted tests install it (tests/unit/conftest.py).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def install() -> bool:
    """Patches the interpreter's generic reduction (and its per-call patching, below); True
    when installed. A Triton without the interpreter parts this patches (or one laid out
    differently) keeps its own code."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    ops = getattr(interpreter, "ReduceOps", None)
    needed = ("generic_reduce", "unravel", "to_tensor")
    if ops is None or not all(hasattr(ops, name) for name in needed):
        return False
    if ops.generic_reduce is not _pairwise_reduce:
        _pairwise_reduce.loop = ops.generic_reduce  # type: ignore[attr-defined]
        ops.generic_reduce = _pairwise_reduce
    full = getattr(interpreter, "_patch_lang", None)
    if callable(full) and hasattr(interpreter, "_LangPatchScope") and full is not _patch_lang_once:
        _patch_lang_once.full = full  # type: ignore[attr-defined]
        interpreter._patch_lang = _patch_lang_once
    grid = getattr(interpreter, "GridExecutor", None)
    if grid is not None and grid.__call__ is not _strict_launch:
        _strict_launch.call = grid.__call__  # type: ignore[attr-defined]
        grid.__call__ = _strict_launch
    return True


def uninstall() -> None:
    """Puts the interpreter's own code back (tests compare the two)."""
    from triton.runtime import interpreter

    loop = getattr(_pairwise_reduce, "loop", None)
    if loop is not None and interpreter.ReduceOps.generic_reduce is _pairwise_reduce:
        interpreter.ReduceOps.generic_reduce = loop
    full = getattr(_patch_lang_once, "full", None)
    if full is not None and interpreter._patch_lang is _patch_lang_once:
        interpreter._patch_lang = full
    call = getattr(_strict_launch, "call", None)
    if call is not None and interpreter.GridExecutor.__call__ is _strict_launch:
        interpreter.GridExecutor.__call__ = call


@functools.cache
def _launch_options() -> frozenset[str]:
    """The keywords a compiled CUDA launch takes besides the kernel's parameters (num_warps,
    maxnreg, launch_pdl, ...): the fields of the CUDA backend's options."""
    import dataclasses

    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl"})
    return frozenset(f.name for f in dataclasses.fields(CUDAOptions))


def _strict_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
    """GridExecutor.__call__ that refuses unknown keywords before the interpreter drops them."""
    unknown = set(kwargs) - set(self.arg_names) - _launch_options()
    if unknown:
        name = getattr(self.fn, "__name__", "kernel")
        raise TypeError(f"{name} launched with unknown keywords: {sorted(unknown)}")
    return _strict_launch.call(self, *args, **kwargs)  # type: ignore[attr-defined]


def _patch_lang_once(fn: Any) -> Any:
    """The interpreter patches triton.language's builtins at a kernel's start and undoes it at
    its end, but it patches them again at every call of a @triton.jit helper inside the kernel:
    a scan of the modules' members each time, about a quarter of an interpreted launch. This
    skips that second patching when every language module the helper sees is still patched
    (its `load` is no longer the builtin), and patches in full otherwise."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    langs = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
    if langs and not any(tl.core.is_builtin(getattr(lang, "load", None)) for lang in langs):
        return interpreter._LangPatchScope()
    return _patch_lang_once.full(fn)  # type: ignore[attr-defined]


def _pairwise_reduce(self: Any, inputs: tuple) -> list:
    original_axis = self.axis
    unravelled, axis = self.unravel(inputs, self.axis)
    dtypes = [t.dtype for t in unravelled]
    data = [np.asarray(t.handle.data) for t in unravelled]
    n = data[0].shape[axis]
    if n & (n - 1):  # Triton's blocks are powers of two; anything else takes the loop
        return _pairwise_reduce.loop(self, inputs)  # type: ignore[attr-defined]
    while n > 1:
        n //= 2
        even = np.arange(0, 2 * n, 2)
        pairs = list(zip(data, dtypes, strict=True))
        left = [self.to_tensor(d.take(even, axis=axis), dt) for d, dt in pairs]
        right = [self.to_tensor(d.take(even + 1, axis=axis), dt) for d, dt in pairs]
        out = self.combine_fn.fn(*left, *right)
        out = out if isinstance(out, tuple) else (out,)
        shape = left[0].handle.data.shape
        data = [
            np.broadcast_to(np.asarray(_array(o), d.dtype), shape)
            for o, d in zip(out, data, strict=True)
        ]
    ret = []
    for d, dt in zip(data, dtypes, strict=True):
        out = np.squeeze(d, axis=axis)
        if self.keep_dims:
            out = np.expand_dims(out, axis) if original_axis is not None else out.reshape((1,))
        elif original_axis is None:
            out = out.item()
        ret.append(self.to_tensor(out, dt))
    return ret


def _array(value: Any) -> Any:
    """A combine function's result as numpy data: a tensor's handle, or a Python constant."""
    handle = getattr(value, "handle", None)
    return value if handle is None else handle.data

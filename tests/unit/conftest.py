"""Shared fixtures of the unit tests."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

Interpreted = Callable[[str], dict]
# Prepended to every interpreted check (a Triton the patch does not fit keeps its own loop).
FAST_REDUCTIONS = "import kernels_support.interpreter\nkernels_support.interpreter.install()\n"


@pytest.fixture(scope="session")
def interpreted() -> Interpreted:
    """Runs Python code with Triton's interpreter (TRITON_INTERPRET=1) and returns the JSON
    object the code prints last.

    The variable must be set before triton is imported, so each check runs in a fresh Python
    process (Triton kernels then run on the CPU, in numpy). The process runs with
    kernels_support.interpreter installed: reductions as a pairwise tree over blocks instead of the
    interpreter's element loop, and triton.language patched once a launch."""

    def run(code: str) -> dict:
        path = os.pathsep.join((str(ROOT), str(ROOT / "tests")))  # kernels_support too
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
        proc = subprocess.run(
            [sys.executable, "-c", FAST_REDUCTIONS + code],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run


Sm90Compile = Callable[[object, dict, dict], object]


@pytest.fixture(scope="session")
def sm90_compile() -> Sm90Compile:
    """Compiles a Triton kernel for an H100/H200 (sm_90) without a GPU: (kernel, argument
    types by name, compile-time constants, compile options such as maxnreg) -> the compiled
    kernel, whose PTX it checks
    targets sm_90 and whose cubin it checks is non-empty. Skips when Triton or its ptxas is
    missing."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)

    def compile_for_sm90(fn: object, types: dict, const: dict, **options: object) -> object:
        signature = {p: "constexpr" if p in const else types[p] for p in fn.arg_names}  # type: ignore[attr-defined]
        try:
            compiled = triton.compile(
                ASTSource(fn, signature, const), target=target, options=options
            )
        except RuntimeError as e:
            if "ptxas" in str(e).lower() and "not found" in str(e).lower():
                pytest.skip(f"no ptxas to finish the lowering: {e}")
            raise
        assert ".target sm_90" in compiled.asm["ptx"]
        assert len(compiled.asm["cubin"]) > 0
        return compiled

    return compile_for_sm90

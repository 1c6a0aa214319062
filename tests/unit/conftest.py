"""Shared fixtures of the unit tests."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

Interpreted = Callable[[str], dict]
# Prepended to every interpreted check (a Triton the patch does not fit keeps its own loop).
FAST_REDUCTIONS = "import kernels_support.interpreter\nkernels_support.interpreter.install()\n"
CHECK_TIMEOUT_S = 240


@pytest.fixture(scope="session")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Interpreted]:
    """Runs Python code with Triton's interpreter (TRITON_INTERPRET=1) and returns the JSON
    object the code prints last.

    The variable must be set before triton is imported, so the checks run in another process
    (Triton kernels then run on the CPU, in numpy): each in a fork of one server that imported
    torch, Triton and the kernels once (tests/kernels_support/fork_server.py). The checks run
    with kernels_support.interpreter installed: reductions as a pairwise tree over blocks
    instead of the interpreter's element loop, and triton.language patched once a launch."""
    path = os.pathsep.join((str(ROOT), str(ROOT / "tests")))  # kernels_support too
    server = subprocess.Popen(
        [sys.executable, "-m", "kernels_support.fork_server"],
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path},
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    tmp = tmp_path_factory.mktemp("interpreted")
    out, err = tmp / "out", tmp / "err"

    def run(code: str) -> dict:
        req = {"code": FAST_REDUCTIONS + code, "out": str(out), "err": str(err)}
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps({**req, "timeout": CHECK_TIMEOUT_S}) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        assert reply, f"the interpreter's fork server exited ({server.poll()})"
        rc = json.loads(reply)["rc"]
        assert rc == 0, f"exit {rc}: " + err.read_text()[-3000:]
        return json.loads(out.read_text().strip().splitlines()[-1])

    yield run
    server.stdin.close()  # type: ignore[union-attr]
    server.wait(30)


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

    from maskgate.kernels.triton.config import FP_FUSION

    target = GPUTarget("cuda", 90, 32)

    def compile_for_sm90(fn: object, types: dict, const: dict, **options: object) -> object:
        signature = {p: "constexpr" if p in const else types[p] for p in fn.arg_names}  # type: ignore[attr-defined]
        options.setdefault("enable_fp_fusion", FP_FUSION)  # as every launch sets it
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

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


@pytest.fixture(scope="session")
def interpreted() -> Interpreted:
    """Runs Python code with Triton's interpreter (TRITON_INTERPRET=1) and returns the JSON
    object the code prints last.

    The variable must be set before triton is imported, so each check runs in a fresh Python
    process (Triton kernels then run on the CPU, in numpy)."""

    def run(code: str) -> dict:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run

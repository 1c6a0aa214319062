"""Fixtures for the fault tests; the harness itself lives in faults_harness.py."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

# Test modules import the harness by name (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from faults_harness import Procs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s

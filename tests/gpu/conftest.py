"""The GPU tests share one device, also when pytest-xdist runs them in several processes.

Each test holds a shared lock on one file for its run; a test marked `gpu_alone` (one that
reads the device's free memory) holds it exclusively, so it runs while no other GPU test
allocates. Under pytest-xdist that wait can outlast the suite's timeout, so a `gpu_alone`
test's timeout covers its body alone (func_only), not the wait in set-up. The workers these
tests build get an explicit KV budget (kv_bytes): the default sizes the cache from the
device's free memory, which the other processes are using too.
"""

from __future__ import annotations

import fcntl
import pathlib
import tempfile
from collections.abc import Iterator

import pytest

LOCK = pathlib.Path(tempfile.gettempdir()) / "maskgate-gpu-tests.lock"
KV_BYTES = 1 << 30


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("gpu_alone") is not None:
            item.add_marker(pytest.mark.timeout(func_only=True))


@pytest.fixture(autouse=True)
def gpu_share(request: pytest.FixtureRequest) -> Iterator[None]:
    alone = request.node.get_closest_marker("gpu_alone") is not None
    with LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture
def kv_bytes() -> int:
    """An explicit KV budget for the ModelRunners the tests build (kv_cache_bytes)."""
    return KV_BYTES

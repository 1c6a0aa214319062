"""The worker app in-process (`create_app` + aiohttp's test client) over the real tiny-random
model. A test module names its settings with a module-scoped `worker_config` fixture; the
model loads once per module."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from maskgate.worker.config import WorkerConfig
from maskgate.worker.server import create_app
from maskgate.worker.server.backend import Backend, load_backend


@pytest.fixture(scope="module")
def backend(worker_config: WorkerConfig) -> Backend:
    return load_backend(worker_config)


@pytest.fixture
async def client(worker_config: WorkerConfig, backend: Backend) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(create_app(worker_config, backend=backend))) as c:
        yield c

"""The worker's heap freeze (docs/worker.md, "Garbage collection"): once the model is loaded,
a full collection no longer walks the objects that loading created."""

from __future__ import annotations

import gc

import pytest
from aiohttp.test_utils import TestClient, TestServer

from maskgate.worker.config import WorkerConfig
from maskgate.worker.engine.engine import freeze_heap
from maskgate.worker.server import app as worker_app
from maskgate.worker.server import create_app
from maskgate.worker.server.backend import Backend


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return WorkerConfig(model="tiny-random", device="cpu", max_num_seqs=4, max_model_len=64)


class Loaded:
    """An object of the loaded heap; `gc.get_objects()` lists it only while it is not frozen."""


def listed(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_freeze_heap_takes_live_objects_out_of_collections() -> None:
    kept = Loaded()
    try:
        freeze_heap()
        assert gc.get_freeze_count() > 0
        assert not listed(kept)  # a full collection no longer walks it
        born_later = Loaded()
        assert listed(born_later)  # what requests create is still collected
    finally:
        gc.unfreeze()
    assert listed(kept)


async def test_a_worker_that_loads_its_model_freezes_then_thaws_at_exit(
    worker_config: WorkerConfig, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model is loaded once per module; the app's start-up path is the one that loads it.
    monkeypatch.setattr(worker_app, "load_backend", lambda config: backend)
    assert gc.get_freeze_count() == 0
    async with TestClient(TestServer(create_app(worker_config))) as c:
        assert (await c.get("/health")).status == 200
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


async def test_a_worker_given_a_shared_backend_leaves_the_heap_alone(
    worker_config: WorkerConfig, backend: Backend
) -> None:
    async with TestClient(TestServer(create_app(worker_config, backend=backend))) as c:
        assert (await c.get("/health")).status == 200
        assert gc.get_freeze_count() == 0

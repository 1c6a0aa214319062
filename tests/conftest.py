"""Fixtures shared by the unit and the GPU tests, and the suite's order for pytest-xdist."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable
from typing import Any

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
# tests/kernels_support (the kernels' oracle checks and logit generators) imports as
# `kernels_support`; tests is no package.
sys.path.insert(0, str(TESTS))
# Directories whose session fixtures start real processes (worker and gateway processes, a
# Prometheus server): under pytest-xdist each one is a single unit of work, run on one xdist
# worker in collection order, so each fixture starts once and a module's tests keep their order.
SHARED_SESSION = ("e2e", "integration/deploy")
# Fixtures of the long tests (a Triton interpreter process, an sm_90 compile): those tests are
# queued right after the SHARED_SESSION units (xdist queues the largest units first) and before
# the other single tests, so the xdist workers end together instead of one running them alone
# at the end.
LONG = frozenset({"interpreted", "sm90_compile"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # sort is stable: each part keeps its collection order.
    items.sort(key=lambda item: LONG.isdisjoint(getattr(item, "fixturenames", ())))


def shared_session_unit(rootpath: pathlib.Path, nodeid: str) -> str:
    """The xdist unit of work a test belongs to: its SHARED_SESSION directory, or itself."""
    path = rootpath / nodeid.split("::", 1)[0]
    if path.is_relative_to(TESTS):
        rel = path.relative_to(TESTS).as_posix()
        for d in SHARED_SESSION:
            if rel.startswith(d + "/"):
                return d
    return nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n N` (xdist's `load` mode) spreads tests one by one, except that each SHARED_SESSION
    directory goes to one worker whole. (xdist's own `loadgroup` marks cannot do this: they
    rename each test's node id, which pytest 9.2 no longer lets a plugin do, so the marks are
    silently ignored: pytest-xdist issue 1386.) Other `--dist` modes are left to xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSessionScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return shared_session_unit(config.rootpath, nodeid)

    return SharedSessionScheduling(config, log)


PlainSample = Callable[..., list[Any]]


@pytest.fixture(scope="session")
def plain_sample() -> PlainSample:
    """kernels.sample called the plain way, the reference for the worker's RowSampler: one
    freshly built tensor per argument, on the logits' device, and the result converted to
    RowResults field by field (no packed copies, no reused buffers).

    plain_sample(logits, rows, cap, keys): keys is the seed of every row, None for an
    unseeded batch."""
    import torch

    from maskgate import kernels
    from maskgate.kernels.result import STATUS_OVERFLOW
    from maskgate.worker.engine.batch import RowResult, RowWork

    def run(
        logits: torch.Tensor, rows: list[RowWork], cap: int, keys: list[int] | None
    ) -> list[RowResult]:
        dev = logits.device
        res = kernels.sample(
            logits,
            torch.tensor([r.params.temperature for r in rows], dtype=torch.float32, device=dev),
            torch.tensor([r.params.top_k for r in rows], dtype=torch.int32, device=dev),
            torch.tensor([r.params.top_p for r in rows], dtype=torch.float32, device=dev),
            torch.tensor([r.params.min_p for r in rows], dtype=torch.float32, device=dev),
            torch.tensor([r.want_mask for r in rows], dtype=torch.bool),
            max_mask_tokens=cap,
            seed=None if keys is None else torch.tensor(keys, dtype=torch.int64, device=dev),
            step=None
            if keys is None
            else torch.tensor([r.step for r in rows], dtype=torch.int64, device=dev),
            bounded=torch.tensor([r.bounded for r in rows], dtype=torch.bool, device=dev),
        )
        out = [
            RowResult(token=t, logprob=lp, nan=bad)
            for t, lp, bad in zip(
                res.tokens.tolist(),
                res.logprobs.double().tolist(),
                res.nan_rows.bool().tolist(),
                strict=True,
            )
        ]
        masks = res.masks()
        for j, row in enumerate(res.mask_rows.tolist()):
            st = int(res.mask_status[j])
            out[row].mask_status = st
            out[row].support_size = int(res.support_sizes[row])
            out[row].mask = None if st == STATUS_OVERFLOW else masks[j]
        return out

    return run

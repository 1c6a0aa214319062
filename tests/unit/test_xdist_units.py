"""Under `-n N`, tests/conftest.py hands each directory with process-starting session fixtures
to one xdist worker whole, so a module whose tests build on each other (the RL loop's weight
versions) runs in order on one worker."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from xdist.remote import Producer

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def conftest(pytestconfig: pytest.Config) -> ModuleType:
    module = pytestconfig.pluginmanager.get_plugin(str(TESTS / "conftest.py"))
    assert isinstance(module, ModuleType)
    return module


@pytest.mark.parametrize(
    ("nodeid", "unit"),
    [
        ("tests/e2e/test_worker_e2e_rl.py::test_update_from_disk", "e2e"),
        ("tests/e2e/test_worker_e2e_rl.py::test_bad_distributed_update_is_refused[x]", "e2e"),
        ("tests/e2e/test_gateway_e2e.py::test_x", "e2e"),
        ("tests/integration/deploy/test_deploy_metrics.py::test_x", "integration/deploy"),
        ("tests/integration/test_gateway_routing.py::test_x", None),
        ("tests/unit/gateway/test_gateway_admission.py::test_x[a/b]", None),
        ("tests/e2efoo/test_x.py::test_x", None),
    ],
)
def test_shared_session_directories_are_one_unit(
    conftest: ModuleType,
    pytestconfig: pytest.Config,
    monkeypatch: pytest.MonkeyPatch,
    nodeid: str,
    unit: str | None,
) -> None:
    monkeypatch.setattr(pytestconfig.option, "dist", "load")
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"])
    sched = conftest.pytest_xdist_make_scheduler(config=pytestconfig, log=Producer("test"))
    assert sched._split_scope(nodeid) == (unit or nodeid)


def test_other_dist_modes_are_left_to_xdist(
    conftest: ModuleType, pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    for mode in ("loadfile", "loadgroup", "each", "no"):
        monkeypatch.setattr(pytestconfig.option, "dist", mode)
        assert conftest.pytest_xdist_make_scheduler(config=pytestconfig, log=Producer("t")) is None

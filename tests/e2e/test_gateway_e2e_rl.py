"""The gateway as the RL control plane, with real processes: a gateway in front of two
tiny-random CPU workers, and a trainer process that talks only to the gateway. One
`/init_weights_update_group` forms a gloo group with both workers (ranks 1 and 2), one
`/update_weights_from_distributed` updates both while the trainer broadcasts; afterwards both
workers serve the trainer's weights (greedy output equal to the model run offline over them)
at the new version, and mask requests through the gateway carry it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_env import REPO, child_env, free_port
from rl_trainer import call_json, offline_greedy, perturbed_weights, save_checkpoint

pytestmark = pytest.mark.e2e

ADMIN = "e2e-admin"
PROMPT = [5, 17, 33, 101, 7]
N = 12
START_S = 180.0


def call(url: str, path: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    """As the admin; status 0 while nothing listens yet."""
    try:
        return call_json(url, path, body, ADMIN, timeout)
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def _until(check: Any, procs: list[tuple[subprocess.Popen[bytes], Path]], what: str) -> None:
    deadline = time.monotonic() + START_S
    while not check():
        for proc, log in procs:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"{what} did not happen in time"
        time.sleep(0.3)


def _versions(gateway: str) -> list[Any] | None:
    """Each endpoint's weight version; None while the gateway answers an error (an endpoint
    not probed yet)."""
    status, body = call(gateway, "/get_weight_version")
    return [e["weight_version"] for e in body["endpoints"]] if status == 200 else None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("gw-rl")
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(name: str, args: list[str]) -> None:
        log = tmp / f"{name}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "maskgate.cli", *args],
            cwd=REPO, env=child_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        procs.append((proc, log))

    workers = []
    for i in range(2):
        port = free_port()
        args = ["worker", "--model", "tiny-random", "--device", "cpu", "--max-model-len", "512"]
        args += ["--max-num-seqs", "4", "--cpu-threads", "1", "--weight-version", "0"]
        start(f"worker{i}", [*args, "--host", "127.0.0.1", "--port", str(port)])
        workers.append(f"http://127.0.0.1:{port}")
    gw_port = free_port()
    config = {
        "host": "127.0.0.1",
        "port": gw_port,
        "admin_key": ADMIN,
        "log_level": "warning",
        "access_log": False,
        "timeouts": {"health_interval_s": 0.5},
        "pools": {"general": {"endpoints": workers}, "mask": {"endpoints": workers}},
        "control": {"flush_interval_s": 0.05, "timeout_s": 180},
    }
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(config))
    start("gateway", ["gateway", "--config", str(tmp / "gateway.yaml")])
    gateway = f"http://127.0.0.1:{gw_port}"
    try:
        _until(lambda: call(gateway, "/get_weight_version")[1] is not None, procs, "gateway up")
        _until(lambda: _versions(gateway) == ["0", "0"], procs, "both workers reporting version 0")
        yield {"gateway": gateway, "workers": workers, "tmp": tmp, "procs": procs}
    finally:
        for proc, _ in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_distributed_sync_through_the_gateway(cluster: dict[str, Any]) -> None:
    gateway, workers = cluster["gateway"], cluster["workers"]
    trainer = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "gateway_trainer.py"), "--url", gateway,
         "--port", str(free_port()), "--seed", "7", "--version", "1", "--key", ADMIN],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert trainer.returncode == 0, trainer.stderr[-3000:]
    out = json.loads(trainer.stdout.strip().splitlines()[-1])
    assert out["ranks"] == 2
    status, init = out["init"]
    assert status == 200, init
    assert sorted(r["rank_offset"] for r in init["endpoints"]) == [1, 2]
    status, update = out["update"]
    assert status == 200, update
    assert [r["stage"] for r in update["endpoints"]] == ["done", "done"]
    assert out["destroy"][0] == 200, out["destroy"]

    status, versions = call(gateway, "/get_weight_version")
    assert (versions["weight_version"], versions["pool_weight_version"]) == ("1", "1")
    assert all(e["serving"] for e in versions["endpoints"])

    expected = offline_greedy(
        save_checkpoint(cluster["tmp"] / "seed7", perturbed_weights(7)).as_posix(), PROMPT, N
    )
    greedy = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}
    for worker in workers:  # both received the broadcast, not just one
        status, body = call(worker, "/generate", {"input_ids": PROMPT, "sampling_params": greedy})
        assert status == 200, body
        assert body["output_ids"] == expected
        assert body["meta_info"]["weight_version"] == "1"
    mask = {
        "input_ids": PROMPT,
        "sampling_params": {"top_k": 5, "max_new_tokens": 4},
        "return_sampling_mask": True,
        "min_weight_version": "1",
    }
    for _ in range(4):
        status, body = call(gateway, "/generate", mask)
        assert status == 200, body
        assert body["meta_info"]["weight_version"] == "1"
    status, body = call(gateway, "/generate", {**mask, "min_weight_version": "2"})
    assert (status, body["error"]["code"]) == (409, "weight_version_unavailable")


def test_rl_loop_example(cluster: dict[str, Any]) -> None:
    """examples/rl_loop.py against the same gateway: with masks, the trainer's log-probs agree
    with the rollout's to float tolerance at every step; without, they do not."""
    out = cluster["tmp"] / "rl_loop.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "rl_loop.py"), "--gateway", cluster["gateway"],
         "--admin-key", ADMIN, "--steps", "2", "--batch", "3", "--max-new-tokens", "8",
         "--json", str(out)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(run.stdout)  # the per-step table, for the log
    steps = json.loads(out.read_text())["steps"]
    assert len(steps) == 2
    versions = [int(s["rollout_version"]) for s in steps]
    assert versions[1] == versions[0] + 1
    for step in steps:
        assert step["masked"]["max_abs"] < 1e-3
        assert step["unmasked"]["mean_abs"] > step["masked"]["mean_abs"]
        assert step["sync_s"] > 0
    status, body = call(cluster["gateway"], "/get_weight_version")
    assert (status, body["weight_version"]) == (200, str(versions[1] + 1))

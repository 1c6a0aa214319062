"""Every metric an alert or a dashboard panel names is really exported: scraped from a gateway
built by `create_app` from the cpu-demo config, and from a real `maskgate worker` process
(tiny random model, CPU) that the gateway routes one mask request to."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

WORKER_START_S = 180  # torch import + tiny model + first Triton/CPU warm-up on 2 slow cores
READY_LINE = re.compile(r"worker ready on http://[^:]+:(\d+)")
API_KEY = "deploy-test-key"
# The Secret gives every shipped gateway an admin key (it listens on 0.0.0.0).
ADMIN_KEY = "deploy-test-admin-key"


def exported_names(text: str) -> set[str]:
    """Sample names a scrape offers, from each family's type, so that labelled families with
    no child yet (no request seen) still count: a counter `x` offers `x_total`, a histogram
    `x` offers `x_bucket`, `x_sum` and `x_count`."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(text):
        if fam.type == "counter":
            names |= {f"{fam.name}_total", f"{fam.name}_created"}
        elif fam.type == "histogram":
            names |= {f"{fam.name}_{s}" for s in ("bucket", "sum", "count", "created")}
        else:
            names.add(fam.name)
        names |= {s.name for s in fam.samples}
    return names


@pytest.fixture(scope="module")
def referenced(rule_groups: dict[str, Any], dashboard: dict[str, Any], kit) -> dict[str, set[str]]:
    """Metric name -> the alerts and panels that query it."""
    out: dict[str, set[str]] = {}
    for where, expr in kit.rule_exprs(rule_groups) + kit.dashboard_exprs(dashboard):
        for name in kit.metric_names(expr):
            out.setdefault(name, set()).add(where)
    return out


def gateway_config(kit, endpoint: str | None) -> Any:
    """The cpu-demo ConfigMap's config, listening on port 0, with both pools pointed at
    `endpoint` (a worker) or empty, instead of the cluster's DNS names."""
    from maskgate.gateway.config import GatewayConfig
    from maskgate.protocol.settings import load_settings

    pool = {"dns": None, "endpoints": [endpoint] if endpoint else []}
    return load_settings(
        GatewayConfig,
        file=kit.K8S / "overlays" / "cpu-demo" / "gateway.yaml",
        env={"MASKGATE_API_KEYS": f'["{API_KEY}"]', "MASKGATE_ADMIN_KEY": ADMIN_KEY},
        overrides={
            "port": 0,
            "metrics_port": None,
            "access_log": False,
            "pools": {"general": pool, "mask": pool},
        },
    )


@pytest.fixture
async def gateway_without_upstreams(kit) -> AsyncIterator[TestServer]:
    from maskgate.gateway import create_app

    server = TestServer(create_app(gateway_config(kit, None)), host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


async def scrape(url: str, key: str | None = None) -> str:
    """GET /metrics; the gateway's, on the traffic port with `api_keys` set, takes a key."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        assert r.status == 200, f"GET {url}: {r.status}"
        return await r.text()


async def test_gateway_exports_every_gateway_metric_the_deploy_uses(
    gateway_without_upstreams: TestServer, referenced: dict[str, set[str]]
) -> None:
    text = await scrape(str(gateway_without_upstreams.make_url("/metrics")), API_KEY)
    names = exported_names(text)
    wanted = {n for n in referenced if not n.startswith("maskgate_worker_")}
    missing = {n: sorted(referenced[n]) for n in wanted - names}
    assert not missing, f"queried but not exported by the gateway: {missing}"


@pytest.fixture(scope="module")
def worker_url(tmp_path_factory: pytest.TempPathFactory, kit) -> Iterator[str]:
    """A real `maskgate worker --model tiny-random --device cpu` on a port it picks (0)."""
    if importlib.util.find_spec("maskgate.cli") is None:
        pytest.skip("the worker package cannot be imported (maskgate.cli missing)")
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    args = ["worker", "--model", "tiny-random", "--device", "cpu", "--role", "mixed"]
    args += ["--host", "127.0.0.1", "--port", "0"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "maskgate.cli", *args],
            cwd=kit.REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        port = wait_for_ready_line(proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def wait_for_ready_line(proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + WORKER_START_S
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        m = READY_LINE.search(text)
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            pytest.fail(
                f"worker exited with {proc.returncode} before it was ready:\n{text[-3000:]}"
            )
        time.sleep(0.2)
    pytest.fail(f"worker not ready within {WORKER_START_S} s:\n{log.read_text()[-3000:]}")


async def test_worker_exports_every_worker_metric_the_deploy_uses(
    worker_url: str, kit, referenced: dict[str, set[str]]
) -> None:
    from maskgate.gateway import create_app

    # One mask request through a gateway to the worker, so the histograms hold real samples
    # (the mask support size at the gateway; batch size and mask kernel time at the worker).
    gateway = TestServer(create_app(gateway_config(kit, worker_url)), host="127.0.0.1")
    await gateway.start_server()
    try:
        body = {
            "text": "The capital of France is",
            "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "top_k": 5},
            "return_sampling_mask": True,
        }
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with aiohttp.ClientSession() as s:
            await wait_until_ready(s, str(gateway.make_url("/readyz")))
            async with s.post(gateway.make_url("/generate"), json=body, headers=headers) as r:
                answer = await r.json()
                assert r.status == 200, answer
        masks = answer["meta_info"]["output_token_sampling_mask"]
        assert masks and all(1 <= len(m) <= 5 for m in masks)

        gateway_text = await scrape(str(gateway.make_url("/metrics")), API_KEY)
        samples = {
            s.name: s.value
            for fam in text_string_to_metric_families(gateway_text)
            for s in fam.samples
            if s.labels.get("pool") == "mask"
        }
        assert samples["maskgate_mask_support_size_count"] == len(masks)
    finally:
        await gateway.close()

    worker_text = await scrape(f"{worker_url}/metrics")
    names = exported_names(worker_text)
    wanted = {n for n in referenced if n.startswith("maskgate_worker_")}
    missing = {n: sorted(referenced[n]) for n in wanted - names}
    assert not missing, f"queried but not exported by the worker: {missing}"
    values = {
        s.name: s.value for fam in text_string_to_metric_families(worker_text) for s in fam.samples
    }
    assert values["maskgate_worker_generated_tokens_total"] >= len(masks)
    assert values["maskgate_worker_batch_size_count"] >= 1


async def wait_until_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 30) -> None:
    """/readyz turns 200 once the first round of health checks has answered."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with session.get(url) as r:
            if r.status == 200:
                return
        await asyncio.sleep(0.1)
    pytest.fail(f"{url} not ready within {timeout_s} s")

"""A real Prometheus server, on loopback, scrapes a gateway built from the cpu-demo ConfigMap
and evaluates the PrometheusRule's alerts; the test reads the outcome through Prometheus' HTTP
API, the way Grafana and Alertmanager would.

The gateway keeps the ConfigMap's DNS discovery: an injected resolver answers the general
pool's headless-Service name with a fake upstream on loopback and the mask pool's with no
records (a mask pool with no Ready pod), which must raise MaskgateNoHealthyMaskEndpoint.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

pytestmark = pytest.mark.integration

API_KEY = "deploy-test-key"
# The Secret gives every shipped gateway an admin key (it listens on 0.0.0.0).
ADMIN_KEY = "deploy-test-admin-key"
DEADLINE_S = 60  # Prometheus start + a few 1 s scrape/evaluation rounds; passes in ~5 s
JOB = "maskgate-gateway"


def free_port() -> int:
    """A loopback port free right now, for a server that cannot report a port-0 binding."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def fake_general_upstream() -> TestServer:
    """The general pool's stand-in: answers health checks and /v1/models like SGLang does."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "demo", "object": "model"}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.fixture
async def gateway(kit) -> AsyncIterator[tuple[TestServer, TestServer]]:
    """(traffic server, metrics server) of a gateway built from the cpu-demo ConfigMap."""
    from maskgate.gateway import create_app
    from maskgate.gateway.app import create_probe_app
    from maskgate.gateway.config import GatewayConfig
    from maskgate.protocol.settings import load_settings

    upstream = await fake_general_upstream()
    config = load_settings(
        GatewayConfig,
        file=kit.K8S / "overlays" / "cpu-demo" / "gateway.yaml",
        env={"MASKGATE_API_KEYS": f'["{API_KEY}"]', "MASKGATE_ADMIN_KEY": ADMIN_KEY},
        # Only the ports move: test servers listen on port 0, the fake upstream on its own.
        overrides={
            "port": 0,
            "metrics_port": 0,
            "access_log": False,
            "pools": {"general": {"dns_port": upstream.port}},
        },
    )
    records = {config.pools.general.dns: ["127.0.0.1"], config.pools.mask.dns: []}

    async def resolver(host: str, port: int) -> list[str]:
        return records[host]

    app = create_app(config, resolver=resolver)
    traffic = TestServer(app, host="127.0.0.1")
    await traffic.start_server()
    metrics = TestServer(create_probe_app(app), host="127.0.0.1")
    await metrics.start_server()
    try:
        yield traffic, metrics
    finally:
        await metrics.close()
        await traffic.close()
        await upstream.close()


@pytest.fixture
def prometheus_bin() -> str:
    from shutil import which

    path = which("prometheus")
    if path is None:
        pytest.skip("prometheus not installed (install the Debian package prometheus)")
    return path


def start_prometheus(
    binary: str, workdir: Path, target: str, rules: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], str]:
    (workdir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = workdir / "prometheus.log"
    for _ in range(3):  # the free port can be taken between the probe and the bind
        port = free_port()
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                cwd=workdir,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        time.sleep(0.3)
        if proc.poll() is None:
            return proc, f"http://127.0.0.1:{port}"
    pytest.fail(f"prometheus did not start:\n{log.read_text()[-3000:]}")


async def api(session: aiohttp.ClientSession, base: str, path: str, **params: str) -> Any:
    async with session.get(f"{base}{path}", params=params) as r:
        body = await r.json()
        assert r.status == 200 and body["status"] == "success", body
        return body["data"]


async def poll(what: str, check, deadline: float) -> Any:
    """Await `check()` until it returns something truthy; fail naming `what` at the deadline."""
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}; last answer: {last!r}")


async def test_prometheus_scrapes_the_gateway_and_evaluates_the_alerts(
    gateway: tuple[TestServer, TestServer],
    prometheus_bin: str,
    rule_groups: dict[str, Any],
    tmp_path: Path,
) -> None:
    traffic, metrics = gateway
    target = f"127.0.0.1:{metrics.port}"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    proc, prom = start_prometheus(prometheus_bin, tmp_path, target, rule_groups)
    deadline = time.monotonic() + DEADLINE_S
    try:
        async with aiohttp.ClientSession() as s:
            # Traffic first, so the counters exist: one proxied answer and one mask rejection.
            async def ready() -> bool:
                async with s.get(traffic.make_url("/readyz")) as r:
                    return r.status == 200

            await poll("the gateway's /readyz", ready, deadline)
            async with s.get(traffic.make_url("/v1/models"), headers=headers) as r:
                assert r.status == 200, await r.text()
            full_vocab = {
                "model": "demo",
                "messages": [{"role": "user", "content": "hi"}],
                "return_sampling_mask": True,
                "return_meta_info": True,
            }
            async with s.post(
                traffic.make_url("/v1/chat/completions"), json=full_vocab, headers=headers
            ) as r:
                assert r.status == 400
                assert (await r.json())["error"]["code"] == "sampling_mask_full_vocabulary"

            async def prom_ready() -> bool:
                try:
                    async with s.get(f"{prom}/-/ready") as r:
                        return r.status == 200
                except aiohttp.ClientConnectionError:
                    assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                    return False

            await poll("Prometheus to start", prom_ready, deadline)

            async def series(query: str) -> list[dict[str, Any]]:
                data = await api(s, prom, "/api/v1/query", query=query)
                return data["result"]

            # The series arrived, with the labels the alerts and the dashboard group by.
            up = await poll(
                "a successful scrape", lambda: series(f'up{{job="{JOB}"}} == 1'), deadline
            )
            assert up[0]["metric"]["instance"] == target
            served = await poll(
                "the proxied request's counter",
                lambda: series(
                    'maskgate_requests_total{route="models",pool="general",status="200"}'
                ),
                deadline,
            )
            assert float(served[0]["value"][1]) == 1
            rejected = await poll(
                "the rejection counter",
                lambda: series('maskgate_rejections_total{code="sampling_mask_full_vocabulary"}'),
                deadline,
            )
            assert float(rejected[0]["value"][1]) == 1
            endpoints = await series("maskgate_pool_endpoints")
            assert {e["metric"]["pool"]: float(e["value"][1]) for e in endpoints} == {
                "general": 1.0,
                "mask": 0.0,
            }

            # Every rule loaded and evaluated without error...
            async def evaluated() -> list[dict[str, Any]] | None:
                groups = (await api(s, prom, "/api/v1/rules"))["groups"]
                rules = [r for g in groups for r in g["rules"]]
                # A rule not evaluated yet reports Go's zero time, 0001-01-01T00:00:00Z.
                done = all(not r["lastEvaluation"].startswith("0001-") for r in rules)
                return rules if rules and done else None

            rules = await poll("every rule to be evaluated", evaluated, deadline)
            assert len(rules) == sum(len(g["rules"]) for g in rule_groups["groups"])
            assert all(r["health"] == "ok" for r in rules), [
                (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"
            ]

            # ...and the empty mask pool raised its alert for this gateway (pending for `for: 1m`).
            async def mask_alert() -> list[dict[str, Any]]:
                alerts = (await api(s, prom, "/api/v1/alerts"))["alerts"]
                return [
                    a for a in alerts if a["labels"]["alertname"] == "MaskgateNoHealthyMaskEndpoint"
                ]

            alerts = await poll("MaskgateNoHealthyMaskEndpoint", mask_alert, deadline)
            assert len(alerts) == 1
            assert alerts[0]["state"] in ("pending", "firing")
            assert alerts[0]["labels"]["instance"] == target
            assert alerts[0]["labels"]["severity"] == "critical"
            others = {
                a["labels"]["alertname"] for a in (await api(s, prom, "/api/v1/alerts"))["alerts"]
            }
            assert others == {"MaskgateNoHealthyMaskEndpoint"}, (
                "a healthy general pool raised alerts"
            )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

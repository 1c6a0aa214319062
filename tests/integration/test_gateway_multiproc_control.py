"""The RL control plane of a real `--workers 3` gateway: whichever process a call lands on,
every process routes by the same versions, stale set, holds, groups and registrations.

SO_REUSEPORT spreads connections over the processes, so every request here goes over a fresh
connection; the first 16 hex digits of a response's `X-Request-Id` name the process."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import pytest
import yaml
from fakes.bodies import MASK_GEN
from test_gateway_process import ROOT, clean_env, free_port

pytestmark = pytest.mark.integration

PROCESSES = 3
KEY = "admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DISK = "/update_weights_from_disk"


class Gateway:
    def __init__(self, url: str, session: aiohttp.ClientSession, pid: int) -> None:
        self.url, self.session, self.pid = url, session, pid  # pid: the supervisor's

    def leader(self) -> psutil.Process:
        """The child listening on the leader's state socket."""
        for child in psutil.Process(self.pid).children():
            with contextlib.suppress(psutil.Error):
                if any(c.laddr.endswith("leader.sock") for c in child.net_connections("unix")):
                    return child
        raise AssertionError("no control leader among the gateway's processes")

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, str]:
        """(status, parsed body, the answering process) over a fresh connection."""
        data = orjson.dumps(body) if body is not None else None
        headers = {**AUTH, "Content-Type": "application/json"}
        async with self.session.request(
            method, self.url + path, data=data, headers=headers
        ) as resp:
            raw = await resp.read()
            rid = resp.headers.get("X-Request-Id", "")
            return resp.status, orjson.loads(raw) if raw else None, rid[:16]

    async def generate(self, n: int) -> list[tuple[int, Any, str]]:
        return list(
            await asyncio.gather(*(self.call("POST", "/generate", MASK_GEN) for _ in range(n)))
        )


@pytest.fixture
async def multiproc(tmp_path: Path) -> AsyncIterator[Callable[[list[str]], Awaitable[Gateway]]]:
    procs: list[asyncio.subprocess.Process] = []
    sessions: list[aiohttp.ClientSession] = []
    log = tmp_path / "gateway.log"

    async def start(urls: list[str]) -> Gateway:
        port = free_port()
        config = {
            "host": "127.0.0.1",
            "port": port,
            "workers": PROCESSES,
            "admin_key": KEY,
            "access_log": False,
            "timeouts": {"connect_s": 1.0, "health_interval_s": 0.05, "health_timeout_s": 0.5},
            "control": {"flush_interval_s": 0.01},
            "pools": {"general": {"endpoints": urls}, "mask": {"endpoints": urls}},
        }
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "maskgate.gateway", "--config", str(path),
                cwd=ROOT, env=clean_env(), stderr=err,
            )  # fmt: skip
        procs.append(proc)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        sessions.append(session)
        gw = Gateway(f"http://127.0.0.1:{port}", session, proc.pid)
        seen: set[str] = set()
        async with asyncio.timeout(60):  # every process up and copying the leader's state
            while len(seen) < PROCESSES:
                try:
                    status, _, process = await gw.call("POST", "/generate", MASK_GEN)
                    if status == 200:
                        seen.add(process)
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
        return gw

    yield start
    for session in sessions:
        await session.close()
    for proc in procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
    if log.exists():
        print(log.read_text()[-4000:])


async def test_sync_once_then_every_process_reports_the_new_version(workers, multiproc):
    a, b = await workers(name="a"), await workers(name="b")
    gw = await multiproc([a.url, b.url])
    status, body, _ = await gw.call("POST", DISK, {"model_path": "/ckpt/1", "weight_version": "1"})
    assert status == 200, body
    for worker in (a, b):  # one sync, run once, by one process (no pause: the default)
        assert [p for p in worker.paths() if p != "/generate"] == [DISK]
    infos = await asyncio.gather(*(gw.call("GET", "/model_info") for _ in range(30)))
    assert {(s, i["weight_version"], i["num_ranks"]) for s, i, _ in infos} == {(200, "1", 2)}
    versions = await asyncio.gather(*(gw.call("GET", "/get_weight_version") for _ in range(30)))
    assert {(v["weight_version"], v["pool_weight_version"]) for _, v, _ in versions} == {("1", "1")}
    out = await gw.generate(60)
    assert {(s, o["meta_info"]["weight_version"]) for s, o, _ in out} == {(200, "1")}
    assert len({p for _, _, p in out}) == PROCESSES


async def test_a_worker_that_failed_a_sync_gets_nothing_from_any_process(workers, multiproc):
    a, b = await workers(name="a"), await workers(name="b", fail_update=True)
    gw = await multiproc([a.url, b.url])
    status, body, _ = await gw.call("POST", DISK, {"model_path": "/ckpt/2", "weight_version": "2"})
    assert status == 502, body
    stages = {r["url"]: r["stage"] for r in body["endpoints"]}
    assert stages == {a.url: "done", b.url: "update"}
    served_by_b = len(b.bodies("/generate"))
    out = await gw.generate(60)
    assert {(s, o["worker"], o["meta_info"]["weight_version"]) for s, o, _ in out} == {
        (200, "a", "2")
    }
    assert len({p for _, _, p in out}) == PROCESSES  # every process took part
    assert len(b.bodies("/generate")) == served_by_b
    infos = await asyncio.gather(*(gw.call("GET", "/get_weight_version") for _ in range(20)))
    for _, info, _ in infos:
        serving = {e["url"]: e["serving"] for e in info["endpoints"]}
        assert serving == {a.url: True, b.url: False}


async def test_requests_sent_during_a_sync_wait_and_get_the_new_version(workers, multiproc):
    a = await workers(name="a", update_delay_s=1.0)
    b = await workers(name="b", fail_update=True, update_delay_s=1.0)
    gw = await multiproc([a.url, b.url])
    sync = asyncio.create_task(
        gw.call("POST", DISK, {"model_path": "/ckpt/3", "weight_version": "3"})
    )
    async with asyncio.timeout(10):
        while not a.bodies(DISK):  # the update runs: every process holds new requests
            await asyncio.sleep(0.01)
    during = asyncio.create_task(gw.generate(45))
    status, _, _ = await sync
    assert status == 502  # b failed: it must serve none of the requests that waited
    out = await during
    assert {(s, o["worker"], o["meta_info"]["weight_version"]) for s, o, _ in out} == {
        (200, "a", "3")
    }
    assert len({p for _, _, p in out}) == PROCESSES


async def test_init_group_assigns_ranks_once(workers, multiproc):
    a, b = await workers(name="a"), await workers(name="b")
    gw = await multiproc([a.url, b.url])
    init = {"master_address": "127.0.0.1", "master_port": 29500, "world_size": 3}
    status, body, _ = await gw.call("POST", "/init_weights_update_group", init)
    assert status == 200, body
    ranks = sorted(w.bodies("/init_weights_update_group")[0]["rank_offset"] for w in (a, b))
    assert ranks == [1, 2]
    assert all(len(w.bodies("/init_weights_update_group")) == 1 for w in (a, b))
    sizes = await asyncio.gather(*(gw.call("GET", "/get_world_size") for _ in range(20)))
    assert {s["world_size"] for _, s, _ in sizes} == {2}
    update = {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[1]], "weight_version": "4"}
    for _ in range(3):  # whichever process takes it, the leader knows the group
        status, body, _ = await gw.call("POST", "/update_weights_from_distributed", update)
        assert status == 200, body


async def test_registration_reaches_every_process(workers, multiproc):
    a, c = await workers(name="a"), await workers(name="c")
    gw = await multiproc([a.url])
    status, body, _ = await gw.call("POST", "/workers", {"url": c.url})
    assert status == 202, body
    lists = await asyncio.gather(*(gw.call("GET", "/list_workers") for _ in range(20)))
    assert all(c.url in urls["urls"] for _, urls, _ in lists)
    out = await gw.generate(90)
    by_process: dict[str, set[str]] = {}
    for status, o, process in out:
        assert status == 200
        by_process.setdefault(process, set()).add(o["worker"])
    assert len(by_process) == PROCESSES
    assert all(names == {"a", "c"} for names in by_process.values()), by_process
    status, _, _ = await gw.call("POST", f"/remove_worker?url={c.url}")
    assert status == 200
    served_by_c = len(c.bodies("/generate"))
    out = await gw.generate(45)
    assert {(s, o["worker"]) for s, o, _ in out} == {(200, "a")}
    assert len(c.bodies("/generate")) == served_by_c


async def test_leader_death_answers_503_then_its_successor_keeps_the_state(workers, multiproc):
    a, b = await workers(name="a"), await workers(name="b", fail_update=True)
    gw = await multiproc([a.url, b.url])
    status, _, _ = await gw.call("POST", DISK, {"model_path": "/ckpt/5", "weight_version": "5"})
    assert status == 502
    old = gw.leader()
    old.kill()
    old.wait(10)
    unavailable = 0
    async with asyncio.timeout(30):  # until the supervisor's new process 0 answers
        while True:
            try:
                status, body, _ = await gw.call("GET", "/get_weight_version")
            except aiohttp.ClientConnectionError:
                continue  # a connection the dead process had accepted
            if status == 200:
                break
            assert (status, body["error"]["code"]) == (503, "control_leader_unavailable")
            unavailable += 1
            await asyncio.sleep(0.02)
    assert unavailable > 0
    assert gw.leader().pid != old.pid
    infos = await asyncio.gather(*(gw.call("GET", "/get_weight_version") for _ in range(20)))
    for _, info, _ in infos:  # restored from the dead leader's last state
        assert info["pool_weight_version"] == "5"
        assert {e["url"]: e["serving"] for e in info["endpoints"]} == {a.url: True, b.url: False}
    out = await gw.generate(45)
    assert {(s, o["worker"]) for s, o, _ in out} == {(200, "a")}

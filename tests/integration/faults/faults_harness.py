"""Harness for the fault tests: the real gateway (`python -m maskgate.gateway --config FILE`) as a
subprocess, in front of `tests/fakes/fault_upstream.py` processes that the tests disrupt with
signals and run-time knobs.

`procs` starts both kinds and reaps everything at the end of a test (stopped processes are
continued first, so nothing is left frozen). The gateway's port comes from its JSON
`listening` log line; its log file stays in the test's tmp_path for post-mortems.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
UPSTREAM_SCRIPT = HERE.parents[1] / "fakes" / "fault_upstream.py"
START_TIMEOUT_S = 30.0  # generous: CI machines are small and busy

# Short timeouts keep every case within a few seconds (seconds).
TIMEOUTS = {
    "connect_s": 0.5,
    "ttfb_s": 1.5,
    "idle_s": 1.0,
    "health_interval_s": 0.1,
    "health_timeout_s": 0.3,
}


class UpstreamProc:
    def __init__(self, proc: subprocess.Popen[bytes], host: str, port: int) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    async def control(self, **knobs: Any) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.post(self.url + "/_control", json=knobs) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def stats(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(self.url + "/_control") as r:
            return await r.json()

    async def count(self, key: str = "requests") -> int:
        return int((await self.stats())["counts"].get(key, 0))


class GatewayProc:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.ps = psutil.Process(proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def resources(self) -> tuple[int, int, int]:
        """(open fds, TCP sockets, TCP sockets in CLOSE_WAIT) of the gateway process."""
        conns = self.ps.net_connections(kind="tcp")
        close_wait = sum(1 for c in conns if c.status == psutil.CONN_CLOSE_WAIT)
        return self.ps.num_fds(), len(conns), close_wait

    async def get(self, path: str) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession(headers=ADMIN_HEADERS) as s,
            s.get(self.url + path) as r,
        ):
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text

    async def metrics(self) -> str:
        status, text = await self.get("/metrics")
        assert status == 200
        return str(text)

    async def metric(self, name: str, **labels: str) -> float:
        return sample(await self.metrics(), name, **labels)

    async def endpoint(self, pool: str, url: str) -> dict[str, Any] | None:
        _, body = await self.get("/admin/pools")
        for p in body["pools"]:
            if p["name"] == pool:
                for ep in p["endpoints"]:
                    if ep["url"] == url:
                        return ep
        return None


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


ADMIN_KEY = "faults-admin"  # the admin API is off without a key (or a loopback admin_port)
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def gateway_config(general: list[str], mask: list[str], **overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "admin_key": ADMIN_KEY,
        "log_level": "info",
        "shutdown_grace_s": 10.0,
        "timeouts": dict(TIMEOUTS),
        "retries": {"max_attempts": 3, "backoff_base_s": 0.005, "backoff_max_s": 0.02},
        "pools": {"general": {"endpoints": general}, "mask": {"endpoints": mask}},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


class Procs:
    """Starts upstreams and gateways for one test; `close` reaps them all."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[subprocess.Popen[bytes]] = []

    def upstream(self, host: str = "127.0.0.1", port: int = 0, **knobs: Any) -> UpstreamProc:
        args = [sys.executable, str(UPSTREAM_SCRIPT), "--host", host, "--port", str(port)]
        for name, value in knobs.items():
            args += ["--" + name.replace("_", "-"), str(value)]
        n = sum(1 for p in self.tmp.iterdir() if p.name.startswith("upstream"))
        log = self.tmp / f"upstream{n}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err)
        self.started.append(proc)
        line = _read_line(proc, START_TIMEOUT_S)
        assert line.startswith("LISTENING "), f"upstream did not start: {log.read_text()}"
        return UpstreamProc(proc, host, int(line.split()[1]))

    async def gateway(self, config: dict[str, Any], wrap: list[str] | None = None) -> GatewayProc:
        n = sum(1 for p in self.tmp.iterdir() if p.name.startswith("gateway"))
        cfg_path = self.tmp / f"gateway{n}.yaml"
        log = self.tmp / f"gateway{n}.log"
        cfg_path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env = {k: v for k, v in env.items() if not k.startswith("MASKGATE_")}
        args = [*(wrap or []), sys.executable, "-m", "maskgate.gateway", "--config", str(cfg_path)]
        with log.open("wb") as out:
            proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=out)
        self.started.append(proc)
        port = await _listening_port(proc, log)
        gw = GatewayProc(proc, port, log)
        await wait_until(lambda: _ready(gw), timeout=START_TIMEOUT_S, what="gateway ready")
        return gw

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().decode().strip() if ready else ""


async def _listening_port(proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited with {proc.returncode}:\n{log.read_text()}")
        for line in log.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") == "listening":
                return int(rec["port"])
        await asyncio.sleep(0.05)
    raise AssertionError(f"gateway did not log 'listening':\n{log.read_text()}")


async def _ready(gw: GatewayProc) -> bool:
    try:
        status, _ = await gw.get("/readyz")
    except aiohttp.ClientError:
        return False
    return status == 200


async def wait_until(
    cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition", step: float = 0.05
) -> None:
    """Poll `cond` (sync or async) until truthy; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(step)


async def assert_no_leak(gw: GatewayProc, before: tuple[int, int, int], slack: int = 4) -> None:
    """fds and sockets settle back near `before`, and no socket lingers in CLOSE_WAIT."""

    def settled() -> bool:
        fds, socks, close_wait = gw.resources()
        return fds <= before[0] + slack and socks <= before[1] + slack and close_wait == 0

    try:
        await wait_until(settled, timeout=5.0, what="fds and sockets to settle")
    except AssertionError:
        conns = [
            (c.laddr.port, c.raddr.ip if c.raddr else "", c.raddr.port if c.raddr else 0, c.status)
            for c in gw.ps.net_connections(kind="tcp")
        ]
        raise AssertionError(f"leak: before {before}, after {gw.resources()}: {conns}") from None


def mount_namespace_wrapper() -> list[str] | None:
    """A command prefix that runs a program with its own /etc/hosts: append the hosts file,
    then the program. None when this machine has no mount namespaces for us (plain
    `unshare -m` needs root; `-r` adds a user namespace where those are allowed)."""
    if shutil.which("unshare") is None:
        return None
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    for flags in (["-m"], ["-rm"]):
        probe = subprocess.run(
            ["unshare", *flags, "sh", "-c", script, "/etc/hostname", "true"],
            capture_output=True,
            timeout=10,
        )
        if probe.returncode == 0:
            return ["unshare", *flags, "sh", "-c", script]
    return None


CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
MASK_GENERATE = {
    "text": "hi",
    "return_sampling_mask": True,
    "sampling_params": {"top_k": 4, "max_new_tokens": 64},
}


def parse_frames(buf: bytes) -> tuple[list[Any], bytes]:
    """Complete SSE frames of `buf` as parsed `data:` payloads ("[DONE]" kept as a string),
    plus the unparsed rest. A line that is not a `data:` field, or whose JSON does not
    parse, becomes `{"malformed": line}`: an SSE client would drop or choke on it."""
    events: list[Any] = []
    while b"\n\n" in buf:
        frame, buf = buf.split(b"\n\n", 1)
        for line in frame.split(b"\n"):
            if not line.startswith(b"data:"):
                events.append({"malformed": line.decode(errors="replace")})
                continue
            data = line[5:].strip()
            try:
                events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
            except ValueError:
                events.append({"malformed": line.decode(errors="replace")})
    return events, buf


class Stream:
    """A client's SSE stream through the gateway, read event by event."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.events: list[Any] = []
        self._buf = b""

    async def next_events(self, count: int = 1) -> None:
        want = len(self.events) + count
        while len(self.events) < want:
            chunk = await self.resp.content.readany()
            assert chunk, f"stream ended after {len(self.events)} events"
            events, self._buf = parse_frames(self._buf + chunk)
            self.events += events

    async def rest(self) -> list[Any]:
        """Read to the end of the stream; the events that came after the ones read so far."""
        start = len(self.events)
        async for chunk in self.resp.content.iter_any():
            events, self._buf = parse_frames(self._buf + chunk)
            self.events += events
        return self.events[start:]

    @property
    def malformed(self) -> list[str]:
        return [e["malformed"] for e in self.events if isinstance(e, dict) and "malformed" in e]

    @property
    def error(self) -> dict[str, Any] | None:
        for e in self.events:
            if isinstance(e, dict) and "error" in e:
                return e["error"]
        return None

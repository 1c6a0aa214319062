"""The gateway as a real process: drain on SIGTERM, and `--workers 2` on one port."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKGATE_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


async def start_gateway(*args: str) -> tuple[asyncio.subprocess.Process, int]:
    """Start `python -m maskgate.gateway ARGS`; returns the process and the port from its log."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "maskgate.gateway",
        *args,
        cwd=ROOT,
        env=clean_env(),
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines = []
    try:
        async with asyncio.timeout(30):
            while True:
                line = await proc.stderr.readline()
                if not line:
                    raise AssertionError(f"gateway exited early: {b''.join(lines).decode()}")
                lines.append(line)
                record = orjson.loads(line)
                if record["msg"] == "listening":
                    return proc, int(record["port"])
    except BaseException:
        proc.kill()
        await proc.wait()
        raise


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    async with asyncio.timeout(30):
        while True:
            try:
                async with session.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)


async def test_sigterm_fails_readiness_then_drains_in_flight_work(upstreams, tmp_path):
    slow = await upstreams(name="slow", delay_s=2.0)
    streamer = await upstreams(name="streamer", chunks=5, chunk_gap_s=0.2)
    config: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "shutdown_delay_s": 1.5,
        "shutdown_grace_s": 10,
        "pools": {"general": {"endpoints": [slow.url]}, "mask": {"endpoints": [streamer.url]}},
        "timeouts": {"health_interval_s": 0.1},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    proc, port = await start_gateway("--config", str(path))
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, url)
            slow_task = asyncio.create_task(
                session.post(url + "/v1/completions", json={"prompt": "x"})
            )
            stream_body = {
                "text": "x",
                "stream": True,
                "return_sampling_mask": True,
                "sampling_params": {"top_k": 2},
            }
            stream_resp = await session.post(url + "/generate", json=stream_body)
            assert stream_resp.status == 200
            while not slow.requests:
                await asyncio.sleep(0.01)

            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            async with session.get(url + "/readyz", headers={"Connection": "close"}) as resp:
                assert resp.status == 503  # readiness fails first, while still listening
                assert (await resp.json())["status"] == "draining"

            resp = await slow_task
            assert resp.status == 200  # the in-flight request finished
            assert resp.headers["X-Upstream"] == "slow"
            raw = await stream_resp.read()
            assert raw.endswith(b"data: [DONE]\n\n")  # and the stream ran to its end
            async with asyncio.timeout(10):
                assert await proc.wait() == 0
            with pytest.raises(aiohttp.ClientConnectionError):
                async with session.get(url + "/healthz", headers={"Connection": "close"}):
                    pass
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_workers_share_one_port(upstreams):
    up = await upstreams()
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "maskgate.gateway",
        "--workers",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--general-endpoint",
        up.url,
        "--no-access-log",
        cwd=ROOT,
        env=clean_env(),
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            await wait_ready(s, url)
            children = [
                c
                for c in psutil.Process(proc.pid).children()
                if "resource_tracker" not in " ".join(c.cmdline())
            ]
            assert len(children) == 2
            for _ in range(20):
                async with s.post(url + "/v1/completions", json={"prompt": "x"}) as resp:
                    assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
        assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert len(up.requests) == 20

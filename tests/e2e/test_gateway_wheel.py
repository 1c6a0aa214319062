"""The gateway image's install, replayed: the project's wheel in a fresh virtual environment
*without* the worker extra. `maskgate gateway` must run there and serve `/healthz`, and torch
must be absent (the gateway image has none)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "triton", "transformers")


def _run(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def gateway_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    pip = ["-m", "pip", "--disable-pip-version-check", "-q"]
    _run([sys.executable, *pip, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(REPO)], 300)
    (wheel,) = (tmp / "dist").glob("maskgate-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], 120)
    # The base install only, resolved from the index as a user's `pip install maskgate` is.
    _run([str(venv / "bin" / "python"), *pip, "install", str(wheel)], 600)
    return venv


def test_the_base_install_has_no_torch(gateway_venv: Path) -> None:
    code = f"import importlib.util as u; print([m for m in {HEAVY!r} if u.find_spec(m)])"
    out = _run([str(gateway_venv / "bin" / "python"), "-c", code], 60, cwd=gateway_venv)
    assert out.stdout.strip() == "[]"
    _run([str(gateway_venv / "bin" / "python"), "-m", "pip", "check"], 60)


def test_maskgate_gateway_help_runs(gateway_venv: Path) -> None:
    out = _run([str(gateway_venv / "bin" / "maskgate"), "gateway", "--help"], 60)
    assert "--general-endpoint" in out.stdout
    out = _run([str(gateway_venv / "bin" / "python"), "-m", "maskgate.gateway", "--help"], 60)
    assert "--mask-endpoint" in out.stdout


def test_a_gateway_from_the_wheel_answers_healthz(gateway_venv: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASKGATE_", "PYTHON"))}
    argv = [str(gateway_venv / "bin" / "maskgate"), "gateway", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--general-endpoint", "http://127.0.0.1:9"]
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        # cwd outside the checkout: the import must come from the installed wheel.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        where = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        assert any(r.get("msg") == "listening" for r in where), log.read_text()[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]

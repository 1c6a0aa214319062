"""The fixed-response upstream: a private nginx started from a generated config in a temp dir.

nginx answers every POST with one canned chat completion from memory (`/generate` with a
canned mask answer: cases.py), so its cost per request
is a small fraction of any proxy's and the three set-ups differ only in what sits in front.
"""

from __future__ import annotations

import shutil
import string
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

from bench.gateway.cases import GENERATE_ANSWER
from bench.gateway.procs import free_port, taskset

TEMPLATE = Path(__file__).with_name("nginx.conf.template")

# What a small OpenAI chat completion looks like on the wire (about 400 bytes). No single
# quotes and no `$`: the body sits inside an nginx string literal.
COMPLETION = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1764400000,
    "model": "bench-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
}


class Nginx:
    """One nginx master + one worker on a free 127.0.0.1 port, pinned to `cpus`."""

    def __init__(self, cpus: str) -> None:
        if shutil.which("nginx") is None:
            raise SystemExit("nginx not found: apt-get install -y nginx")
        self.cpus = cpus
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Nginx:
        body = orjson.dumps(COMPLETION).decode()
        generate = orjson.dumps(GENERATE_ANSWER).decode()
        assert "'" not in body + generate and "$" not in body + generate
        conf = string.Template(TEMPLATE.read_text()).substitute(
            dir=self._dir, port=self.port, completion=body, generate=generate
        )
        (self._dir / "nginx.conf").write_text(conf)
        log = (self._dir / "stdout.log").open("wb")
        self.proc = subprocess.Popen(
            [
                *taskset(self.cpus),
                "nginx",
                "-p",
                str(self._dir),
                "-c",
                str(self._dir / "nginx.conf"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"nginx exited: {(self._dir / 'error.log').read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise SystemExit("nginx did not answer /health within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: nginx's fast shutdown, workers included
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The README's first command, the way a new user runs it: `maskgate up` on a fresh model
cache (so SmolLM2 is fetched and converted), then the banner's mask request and a plain
request through the printed URL, then Ctrl-C, which must stop every child cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 600.0  # a cold pip cache downloads 93 MB before converting


def _maskgate_command() -> list[str]:
    script = Path(sys.executable).with_name("maskgate")
    # The console script a user runs; without an install, the same entry point by module.
    return [str(script)] if script.exists() else [sys.executable, "-m", "maskgate.cli"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("transformers")
    cache = tmp_path_factory.mktemp("fresh-cache")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKGATE_")}
    env["MASKGATE_WORKER_CACHE_DIR"] = str(cache)
    proc = subprocess.Popen(
        [*_maskgate_command(), "up", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cache,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    url: list[str] = []
    ready = threading.Event()

    def read() -> None:  # keeps draining after start-up, so `up` never blocks on its pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            m = re.match(r"maskgate is up: (http://\S+)", line)
            if m:
                url.append(m.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(UP_TIMEOUT_S) and url, "".join(lines)[-4000:]
        yield url[0], proc, lines, cache
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)


def test_demo_serves_a_mask_request_and_a_general_request_then_stops_cleanly(demo) -> None:
    from openai import OpenAI

    url, proc, lines, cache = demo
    assert (cache / "models" / "smollm2" / "config.json").is_file()  # converted on this run
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)
    # The banner's example, as printed.
    r = client.chat.completions.create(
        model="smollm2",
        max_tokens=8,
        temperature=0.7,
        top_p=0.9,
        messages=[{"role": "user", "content": "Name a colour."}],
        extra_body={"return_sampling_mask": True, "return_meta_info": True},
    )
    meta = r.choices[0].meta_info  # type: ignore[attr-defined]
    masks = meta["output_token_sampling_mask"]
    logprobs = meta["output_token_sampling_logprobs"]
    assert 1 <= len(masks) == len(logprobs) == meta["output_token_sampling_mask_length"] <= 8
    assert all(len(m) >= 1 for m in masks) and all(lp <= 0.0 for lp in logprobs)
    # A plain request goes to the general worker and carries no mask.
    plain = client.chat.completions.create(
        model="smollm2",
        max_tokens=4,
        temperature=0,
        messages=[{"role": "user", "content": "Say hi."}],
    )
    assert plain.choices[0].message.content is not None
    assert "meta_info" not in (plain.choices[0].model_extra or {})

    # Ctrl-C, as a user stops it: every child stops and `up` exits 0.
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, "".join(lines)[-4000:]
    time.sleep(0.5)  # the reader thread has the last lines
    out = "".join(lines)
    for child in ("general worker", "mask worker", "gateway"):
        assert f"{child} stopped" in out, out[-3000:]
    assert "killed" not in out, out[-3000:]

"""`maskgate up`: the one-command demo on this machine.

Starts a general worker, a mask worker and the gateway in front of them as child processes
on free ports, waits until all three answer, prints the URL and example requests, and stops
them all on Ctrl-C or SIGTERM. Each child's output goes to a log file in a run directory;
when a child dies, the tail of its log is printed and everything stops.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from maskgate.protocol.policy_settings import MAX_MASK_TOKENS

READY_TIMEOUT_S = 600.0  # first run downloads and converts the model
STOP_TIMEOUT_S = 15.0


@dataclass
class Child:
    name: str
    argv: list[str]
    url: str
    ready_path: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    def start(self) -> None:
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,  # Ctrl-C reaches only `up`, which stops children in order
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(f"  | {line}" for line in text[-lines:])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maskgate up",
        description="Run the demo: a gateway plus one general and one mask worker on the CPU.",
    )
    p.add_argument("--model", default="smollm2", help="model spec (default smollm2)")
    p.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="gateway port (default 8080; 0: any)")
    p.add_argument("--general-port", type=int, default=0, help="general worker port (0: any)")
    p.add_argument("--mask-port", type=int, default=0, help="mask worker port (0: any)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--max-mask-tokens", type=int, default=MAX_MASK_TOKENS, help="mask cap C")
    p.add_argument("--max-model-len", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--max-num-seqs", type=int, default=16, help="sequences per worker")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    t0 = time.monotonic()
    run_dir = Path(tempfile.mkdtemp(prefix="maskgate-up-"))
    say = _Say(t0)
    if args.model == "smollm2":  # fetch + convert once, before two workers load it
        from maskgate.worker.model import ModelFetchError, ensure_smollm2

        say("preparing SmolLM2-135M-Instruct (downloaded and converted on first run)")
        try:
            ensure_smollm2(progress=lambda msg: say("  " + msg))
        except ModelFetchError as e:
            say(f"error: {e}")
            return 1
        except KeyboardInterrupt:
            say("interrupted")
            return 130
    children = _plan(args, run_dir)
    if args.port and not children[-1].url.endswith(f":{args.port}"):
        say(f"port {args.port} is taken; the gateway uses a free one")
    gateway = children[-1]
    stop = _install_stop_handlers()
    clean = False
    try:
        # Workers first: a gateway that found them still loading would mark them unhealthy
        # and wait for passing health checks before routing.
        for phase in (children[:-1], children[-1:]):
            for child in phase:
                say(f"starting {child.name} on {child.url} (log: {child.log_path})")
                child.start()
            if not _wait_ready(phase, children, say, stop):
                clean = bool(stop)
                return 0 if stop else 1
        say(f"ready in {time.monotonic() - t0:.0f} s")
        print(_banner(gateway.url, args.model, args.max_mask_tokens), flush=True)
        while not stop:
            dead = [c for c in children if c.exited() is not None]
            if dead:
                _report_dead(dead, say)
                return 1
            time.sleep(0.5)
        clean = True
        return 0
    finally:
        _stop_all(children, say)
        if clean:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            say(f"logs kept in {run_dir}")


def _plan(args: argparse.Namespace, run_dir: Path) -> list[Child]:
    py = sys.executable
    host = "127.0.0.1"
    # Each child reads its own MASKGATE_* variables (the gateway skips MASKGATE_WORKER_*);
    # the flags below win over them.
    env = dict(os.environ)
    # Two workers share this machine's cores: each gets half (oversubscribed OpenMP threads
    # slowed a CPU decode step by up to 10x in testing).
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    children = []
    for role, port in (("general", args.general_port), ("mask", args.mask_port)):
        port = port or _free_port(host)
        argv = [py, "-m", "maskgate.cli", "worker", "--model", args.model, "--role", role]
        argv += ["--host", host, "--port", str(port), "--device", args.device]
        argv += ["--max-mask-tokens", str(args.max_mask_tokens)]
        argv += ["--max-model-len", str(args.max_model_len)]
        argv += ["--max-num-seqs", str(args.max_num_seqs)]
        argv += ["--cpu-threads", str(threads)]
        url = f"http://{host}:{port}"
        log_path = run_dir / f"{role}-worker.log"
        children.append(Child(f"{role} worker", argv, url, "/health", log_path, env))
    gport = args.port if args.port and _port_free(args.host, args.port) else 0
    gport = gport or _free_port(args.host)
    argv = [py, "-m", "maskgate.cli", "gateway", "--host", args.host, "--port", str(gport)]
    argv += ["--general-endpoint", children[0].url, "--mask-endpoint", children[1].url]
    argv += ["--max-mask-tokens", str(args.max_mask_tokens)]
    show = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    gw = Child("gateway", argv, f"http://{show}:{gport}", "/readyz", run_dir / "gateway.log", env)
    return [*children, gw]


class _StopFlag:
    def __init__(self) -> None:
        self.set = False

    def __bool__(self) -> bool:
        return self.set


def _install_stop_handlers() -> _StopFlag:
    flag = _StopFlag()

    def handler(signum: int, _frame: object) -> None:
        flag.set = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return flag


def _wait_ready(phase: list[Child], children: list[Child], say: _Say, stop: _StopFlag) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = list(phase)
    last_note = time.monotonic()
    while pending:
        if stop:
            return False
        dead = [c for c in children if c.exited() is not None]
        if dead:
            _report_dead(dead, say)
            return False
        for child in list(pending):
            if child.ready():
                say(f"{child.name} is ready")
                pending.remove(child)
        if time.monotonic() > deadline:
            say(f"gave up after {READY_TIMEOUT_S:.0f} s waiting for: {[c.name for c in pending]}")
            return False
        if pending and time.monotonic() - last_note > 10:
            say("still loading: " + ", ".join(c.name for c in pending))
            last_note = time.monotonic()
        time.sleep(0.25)
    return True


def _report_dead(dead: list[Child], say: _Say) -> None:
    for child in dead:
        say(f"{child.name} exited with status {child.exited()}; last lines of {child.log_path}:")
        print(child.tail(), flush=True)


def _stop_all(children: list[Child], say: _Say) -> None:
    live = [c for c in children if c.proc is not None and c.exited() is None]
    if live:
        say("stopping " + ", ".join(c.name for c in live))
    for child in reversed(live):  # the gateway first, so no request reaches a stopped worker
        assert child.proc is not None
        child.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    for child in live:
        assert child.proc is not None
        try:
            child.proc.wait(max(0.1, t0 + STOP_TIMEOUT_S - time.monotonic()))
            say(f"{child.name} stopped ({time.monotonic() - t0:.1f} s)")
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
            say(f"{child.name} killed after {STOP_TIMEOUT_S:.0f} s")
    for child in children:
        if child.log is not None:
            child.log.close()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class _Say:
    def __init__(self, t0: float) -> None:
        self.t0 = t0

    def __call__(self, msg: str) -> None:
        print(f"[maskgate up {time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)


def _banner(url: str, model: str, cap: int) -> str:
    return f"""
maskgate is up: {url}  (OpenAI base URL: {url}/v1, model "{model}")

A mask request (top-p 0.9): every generated token comes with the ids it could have been
drawn from and its log-prob under that truncated distribution:

  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{{
    "model": "{model}", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
    "messages": [{{"role": "user", "content": "Name a colour."}}],
    "return_sampling_mask": true, "return_meta_info": true}}'

The same with the OpenAI SDK:

  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="unused")
  r = client.chat.completions.create(
      model="{model}", max_tokens=8, temperature=0.7, top_p=0.9,
      messages=[{{"role": "user", "content": "Name a colour."}}],
      extra_body={{"return_sampling_mask": True, "return_meta_info": True}})
  print(r.choices[0].meta_info["output_token_sampling_mask"])

Requests without return_sampling_mask go to the general worker; masks wider than
{cap} ids answer 400 (send "sampling_mask_mode": "bounded" to get them truncated).
Gateway metrics: {url}/metrics.  Ctrl-C stops everything.
"""

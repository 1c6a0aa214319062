"""Runs the unit tests' interpreted checks (tests/unit/conftest.py), each in a fork of one
process that has already imported torch, Triton (under TRITON_INTERPRET=1) and the kernels.

A fresh interpreter per check spent about 2 s of CPU importing before the check began; a fork
starts at once and still isolates the check: module state it patches (the interpreter's
reductions, band_config's caches) dies with it.

Protocol, one JSON line each way: {"code", "out", "err", "timeout"} in, {"rc"} out. The child
runs `code` as __main__ with its stdout and stderr in the files `out` and `err`; rc is its exit
code, -9 when it ran past `timeout` seconds and was killed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

PRELOAD = (
    "numpy",
    "torch",
    "triton",
    "triton.language",
    "maskgate.kernels.reference",
    "maskgate.kernels.cpu.torch_path",
    "maskgate.kernels.triton.launch",
    "maskgate.kernels.triton.sort",
)


def main() -> None:
    import importlib

    import kernels_support.interpreter

    kernels_support.interpreter.install()
    for name in PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_check(req)
        print(json.dumps({"rc": wait(pid, req["timeout"])}), flush=True)


def run_check(req: dict) -> None:
    """The child: runs the check, then exits without returning (no cleanup of the parent's)."""
    rc = 1
    try:
        for path, fd in ((req["out"], 1), (req["err"], 2)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        sys.stdin = open(os.devnull)  # noqa: SIM115 (the child exits through os._exit)
        exec(compile(req["code"], "<check>", "exec"), {"__name__": "__main__"})
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def wait(pid: int, timeout: float) -> int:
    """The child's exit code; it is killed (-9) past timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL
        time.sleep(0.005)


if __name__ == "__main__":
    main()

"""The server behind the `interpreted` fixture (tests/kernels_support/fork_server.py): a check
that fails must come back as a failure with its traceback, and one that hangs must be killed,
or every interpreted test would pass whatever its kernels did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fork_server_reports_output_failures_exits_and_timeouts(tmp_path: Path) -> None:
    checks = [
        ("import json; print(json.dumps({'ok': __name__}))", 5),
        ("raise ValueError('broken kernel')", 5),
        ("import sys; sys.exit(3)", 5),
        ("import time; time.sleep(30)", 1),
        ("GLOBAL = 1", 5),
        ("print(json.dumps({'leaked': 'GLOBAL' in globals()}))\n", 5),
    ]
    reqs = [
        {"code": code, "out": str(tmp_path / f"{i}.out"), "err": str(tmp_path / f"{i}.err"),
         "timeout": timeout}
        for i, (code, timeout) in enumerate(checks)
    ]  # fmt: skip
    reqs[-1]["code"] = "import json\n" + reqs[-1]["code"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "tests")))}
    done = subprocess.run(
        [sys.executable, "-m", "kernels_support.fork_server"],
        input="".join(json.dumps(r) + "\n" for r in reqs),
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rcs = [json.loads(line)["rc"] for line in done.stdout.splitlines()]
    assert rcs == [0, 1, 3, -9, 0, 0]
    out = [Path(r["out"]).read_text() for r in reqs]
    err = [Path(r["err"]).read_text() for r in reqs]
    assert json.loads(out[0]) == {"ok": "__main__"}
    assert "ValueError: broken kernel" in err[1]
    assert json.loads(out[5]) == {"leaked": False}  # each check starts from fresh globals

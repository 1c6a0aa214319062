"""Summarising py-spy's raw (collapsed) stacks: where the gateway's time goes.

Each line of `py-spy record --format raw` is `frame;frame;...;leaf COUNT`, a frame being
`function (file:line)`. Self time is counted at the leaf, inclusive time once per stack for
every distinct function in it.

    .venv/bin/python -m bench.gateway.stacks bench/results/gateway_mask_profile.txt
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _name(frame: str) -> str:
    """`handle (maskgate/gateway/proxy/handler.py:80)` -> `maskgate/gateway/proxy/handler.py:handle`
    (line numbers dropped)."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for marker in ("site-packages/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{m['func']}"


# Who a sample's time belongs to: the first frame from the leaf up whose file matches a rule.
# Shared helpers (aiohttp's writer and stream reader serve both sides) match no rule, so the
# caller above them decides.
OWNERS = (
    ("aiohttp client", ("aiohttp/client", "aiohttp/connector.py")),
    (
        "gateway upstream client",
        ("maskgate/gateway/upstream/client.py", "maskgate/gateway/upstream/http1"),
    ),
    ("aiohttp server", ("aiohttp/web_",)),
    ("gateway logic", ("gateway/", "prometheus_client/", "logging/", "json/")),
    ("asyncio.timeout", ("asyncio/timeouts.py",)),
    ("event loop", ("asyncio/", "uvloop", "selectors.py")),
)


def owner(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, prefixes in OWNERS:
            if frame.startswith(prefixes):
                return name
    if any(frame.startswith("aiohttp/") for frame in frames):
        return "aiohttp I/O, caller unseen"  # asyncio splits stacks at every resumption
    return "other"


def by_owner(text: str) -> tuple[int, Counter[str]]:
    total, owners = 0, Counter[str]()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            n = int(m["count"])
            total += n
            owners[owner([_name(f) for f in m["stack"].split(";") if f])] += n
    return total, owners


def summarise(text: str) -> tuple[int, Counter[str], Counter[str]]:
    total, own, incl = 0, Counter[str](), Counter[str]()
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        n = int(m["count"])
        frames = [_name(f) for f in m["stack"].split(";") if f]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for name in set(frames):
            incl[name] += n
    return total, own, incl


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("raw", type=Path)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--match", default="", help="only inclusive rows containing this text")
    args = p.parse_args()
    text = args.raw.read_text()
    total, owners = by_owner(text)
    print(f"{total} samples\n\nby owner:")
    for name, n in owners.most_common():
        print(f"{100 * n / total:6.1f}%  {name}")
    total, own, incl = summarise(text)
    print("\nself time:")
    for name, n in own.most_common(args.top):
        print(f"{100 * n / total:6.1f}%  {name}")
    print("\ninclusive time:")
    rows = [(k, v) for k, v in incl.most_common() if args.match in k][: args.top]
    for name, n in rows:
        print(f"{100 * n / total:6.1f}%  {name}")


if __name__ == "__main__":
    main()

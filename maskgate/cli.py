"""The `maskgate` command: `gateway`, `worker` and `up` (the one-command demo).

Importing this module must not import torch: the gateway image installs no worker extra, and
`maskgate gateway` has to work there. Each subcommand imports its own package when it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: maskgate {gateway,worker,up} ...

  gateway   the reverse proxy (see `maskgate gateway --help`)
  worker    a model worker: SGLang/OpenAI-compatible, with sampling masks
  up        the demo: a gateway, a general and a mask worker on this machine
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "gateway":
        from maskgate.gateway.cli import main as gateway_main

        return gateway_main(rest)
    if command == "worker":
        from maskgate.worker.cli import main as worker_main

        return worker_main(rest)
    if command == "up":
        from maskgate.demo import main as up_main

        return up_main(rest)
    print(f"maskgate: unknown command {command!r}\n\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""A stand-in RL trainer that sees only the gateway: it asks the pool's rank count, forms one
gloo group with every worker behind it through one `/init_weights_update_group`, broadcasts
perturbed tiny-random weights while one `/update_weights_from_distributed` on the gateway
updates them all, and tears the group down. Prints one JSON line with every answer.

    python tests/e2e/gateway_trainer.py --url GATEWAY --port FREE_PORT --seed 7 --version 1
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_trainer import perturbed_weights

GROUP = "gateway-rl"


def request(url: str, path: str, body: Any, key: str, timeout: float = 180) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    req = urllib.request.Request(
        url + path, data, headers, method="GET" if body is None else "POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    return thread, box


def main() -> None:
    from maskgate.worker.weight_group import create_group

    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--key", default="")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    _, world = request(args.url, "/get_world_size", None, args.key)
    ranks = world["world_size"]
    out["ranks"] = ranks
    init = {"master_address": "127.0.0.1", "master_port": args.port, "rank_offset": 1,
            "world_size": 1 + ranks, "group_name": GROUP, "backend": "gloo"}  # fmt: skip
    # Every worker blocks in the rendezvous until rank 0 joins: call first, then join.
    thread, box = in_thread(lambda: request(args.url, "/init_weights_update_group", init, args.key))
    group = create_group(master_address="127.0.0.1", master_port=args.port, rank=0,
                         world_size=1 + ranks, group_name=GROUP, backend="gloo", timeout_s=120)  # fmt: skip
    thread.join()
    out["init"] = box[0]
    tensors = perturbed_weights(args.seed)
    body = {"names": list(tensors), "dtypes": ["float32"] * len(tensors),
            "shapes": [list(t.shape) for t in tensors.values()], "group_name": GROUP,
            "weight_version": args.version}  # fmt: skip
    # The gateway pauses and flushes every worker, then forwards the update to all of them
    # at once; they receive while rank 0 broadcasts, in the same order as `names`.
    thread, box = in_thread(
        lambda: request(args.url, "/update_weights_from_distributed", body, args.key)
    )
    group.broadcast(list(tensors.values()))
    thread.join()
    out["update"] = box[0]
    out["destroy"] = request(
        args.url, "/destroy_weights_update_group", {"group_name": GROUP}, args.key
    )
    group.destroy()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

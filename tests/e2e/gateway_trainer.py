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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_trainer import call_json, distributed_body, form_group, in_thread, perturbed_weights

GROUP = "gateway-rl"


def request(url: str, path: str, body: Any, key: str) -> tuple[int, Any]:
    return call_json(url, path, body, key, timeout=180)


def main() -> None:
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
    # Every worker blocks in the rendezvous until rank 0 joins.
    group, out["init"] = form_group(
        lambda path, body: request(args.url, path, body, args.key), args.port, ranks, GROUP, 120
    )
    tensors = perturbed_weights(args.seed)
    body = distributed_body(tensors, GROUP, weight_version=args.version)
    # The gateway holds new requests for the pool, then forwards the update to every worker
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

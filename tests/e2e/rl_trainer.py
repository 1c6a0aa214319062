"""A stand-in RL trainer, run as its own process against a real worker: it pushes tiny-random
weights perturbed by a seed through /update_weights_from_distributed (rank 0 of a gloo group,
broadcasting from its own CPU memory) or /update_weights_from_tensor (a safetensors payload, or
shared-memory CPU tensors pickled with torch's multiprocessing reductions).

Long-lived mode (`serve`): one JSON command per stdin line, one JSON result per stdout line,
so a test starts one trainer for many updates. `die` / `stall` modes break off a broadcast
halfway (exit, or sleep until killed) to show the worker does not hang.

Also imported by the tests and gateway_trainer.py for the same weights, the offline greedy
reference, the JSON calls and rank 0 of the weight group.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

GROUP = "rl-test-group"


def perturbed_weights(seed: int) -> dict[str, torch.Tensor]:
    """tiny-random's weights plus seeded noise of half their spread: a different greedy path."""
    from maskgate.worker.model.tiny_random import tiny_weights

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in tiny_weights().items():
        noise = torch.randn(t.shape, generator=gen) * (0.5 * float(t.std()) if t.numel() > 1 else 0)
        out[name] = (t + noise).contiguous()
    return out


def save_checkpoint(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    from maskgate.worker.model import save_tiny_random

    save_tiny_random(path)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def offline_greedy(spec: str, prompt: list[int], n: int, device: str = "cpu") -> list[int]:
    """The worker's model run in-process over `spec`'s weights: argmax decoding (float32 on
    the CPU, bfloat16 on CUDA, the worker's defaults)."""
    from maskgate.worker.engine.batch import RowWork
    from maskgate.worker.runner.runner import ModelRunner

    runner = ModelRunner(spec, device=device, max_num_slots=1, max_model_len=len(prompt) + n + 1)
    out: list[int] = []
    row = RowWork(0, prompt, 0, sample=True)
    for _ in range(n):
        token = int(runner.logits([row])[0].argmax())
        out.append(token)
        row = RowWork(0, [token], row.start_pos + len(row.token_ids), sample=True)
    return out


def call_json(
    url: str, path: str, body: Any = None, key: str | None = None, timeout: float = 120
) -> tuple[int, Any]:
    """(status, parsed body) of a POST of `body` as JSON, or a GET when `body` is None; with
    `key`, as a bearer token. Error statuses are answers too, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(
        url + path, data, headers, method="GET" if body is None else "POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def post(url: str, path: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, Any]:
    return call_json(url, path, body, timeout=timeout)


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    """`fn()` started on a daemon thread; its result lands in the box once joined."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    return t, box


def form_group(
    call: Any, port: int, ranks: int, group_name: str, timeout_s: float
) -> tuple[Any, Any]:
    """Rank 0 of a gloo group with `ranks` engine ranks (1..ranks): `call(path, body)` sends
    /init_weights_update_group, which blocks in the rendezvous until rank 0 joins, so it runs
    on a thread while this process joins. Returns (the group, that call's answer)."""
    from maskgate.worker.rl.weight_group import create_group

    body = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": 1 + ranks, "group_name": group_name, "backend": "gloo"}  # fmt: skip
    t, box = in_thread(lambda: call("/init_weights_update_group", body))
    group = create_group(master_address="127.0.0.1", master_port=port, rank=0,
                         world_size=1 + ranks, group_name=group_name, backend="gloo",
                         timeout_s=timeout_s)  # fmt: skip
    t.join()
    return group, box[0]


def distributed_body(tensors: dict[str, torch.Tensor], group_name: str, **extra: Any) -> dict:
    """/update_weights_from_distributed for float32 `tensors`, broadcast in their order."""
    return {"names": list(tensors), "dtypes": ["float32"] * len(tensors),
            "shapes": [list(t.shape) for t in tensors.values()], "group_name": group_name,
            **extra}  # fmt: skip


class Trainer:
    def __init__(self, url: str) -> None:
        self.url = url
        self.group: Any = None

    def init_group(self, port: int) -> Any:
        self.group, answer = form_group(
            lambda path, body: post(self.url, path, body), port, 1, GROUP, timeout_s=10
        )
        return answer

    def distributed(self, cmd: dict[str, Any], halt: str | None = None) -> Any:
        tensors = perturbed_weights(cmd["seed"])
        body = distributed_body(
            tensors, GROUP, flush_cache=False, weight_version=cmd.get("version")
        )
        for key in ("names", "dtypes", "shapes"):  # a bad entry, to be refused
            if key in cmd.get("override", {}):
                body[key][0] = cmd["override"][key]
        t, box = in_thread(lambda: post(self.url, "/update_weights_from_distributed", body))
        values = list(tensors.values())
        if halt is not None:
            self.group.broadcast(values[: len(values) // 2])
            print(json.dumps({"halted": halt}), flush=True)
            if halt == "die":
                os._exit(3)
            time.sleep(3600)  # stalled: the test kills this process
        try:
            self.group.broadcast(values)
            sent = True
        except Exception:  # the worker refused the update and left the group
            sent = False
        t.join()
        return {"status": box[0][0], "body": box[0][1], "broadcast_completed": sent}

    def tensor(self, cmd: dict[str, Any]) -> Any:
        """`format`: "safetensors" (the default: the bytes themselves, no pickle) or
        "shared_memory" (SGLang's MultiprocessingSerializer over shared-memory tensors);
        CUDA tensors always travel as CUDA IPC handles."""
        from multiprocessing.reduction import ForkingPickler

        weights = perturbed_weights(cmd["seed"])
        fmt = "pickle" if cmd.get("device", "cpu") == "cuda" else cmd.get("format", "safetensors")
        load_format = None
        if fmt == "safetensors":
            from safetensors.torch import save

            named: Any = []
            raw, load_format = save(weights), "safetensors"
        else:
            if fmt == "pickle":  # CUDA IPC handles; bfloat16, as trainers send
                named = [(n, t.to("cuda", torch.bfloat16)) for n, t in weights.items()]
                torch.cuda.synchronize()
            else:  # shared memory, by file name: the worker is not this process's child
                torch.multiprocessing.set_sharing_strategy("file_system")
                named = [(n, t.share_memory_()) for n, t in weights.items()]
            buf = io.BytesIO()
            ForkingPickler(buf).dump(named)
            raw = buf.getvalue()
        payload = base64.b64encode(raw).decode()
        body = {"serialized_named_tensors": [payload], "load_format": load_format,
                "weight_version": cmd.get("version")}  # fmt: skip
        status, reply = post(self.url, "/update_weights_from_tensor", body)
        del named  # the shared tensors stay alive until the worker answered
        return {"status": status, "body": reply}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve", "die", "stall"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    trainer = Trainer(args.url)
    if args.mode != "serve":
        print(json.dumps({"init": trainer.init_group(args.port)}), flush=True)
        trainer.distributed({"seed": 99, "version": "never"}, halt=args.mode)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "init":
            result: Any = trainer.init_group(cmd["port"])
        elif cmd["op"] == "distributed":
            result = trainer.distributed(cmd)
        else:
            result = trainer.tensor(cmd)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

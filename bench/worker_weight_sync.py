"""Time a full weight sync into a running worker: from disk, from tensors (CUDA IPC on the
same GPU, shared memory on the CPU) and, with two GPUs (or on the CPU), from a trainer's
broadcast (NCCL / gloo).

Random bfloat16 weights shaped like Qwen2.5-1.5B (bench/shapes.py), nothing downloaded. The
benchmark writes two checkpoints (seeds A and B) to local disk, starts a real worker process
on checkpoint A, and then, for each source, alternates A and B for `--reps` full syncs. It
times each HTTP call from send to answer (validated, received and copied in). After each
source's last sync (weights B) it asks for a greedy /generate; every source must give the
same tokens as the disk sync, which checks that a sync really replaced all weights.

    python -m bench.worker_weight_sync            # the H200 run: Qwen2.5-1.5B shape
    python -m bench.worker_weight_sync --small    # CPU check with a small config

Results: a table on stdout, bench/results/worker_weight_sync.json + .png (`--small`:
worker_weight_sync_small.*).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bench.plotting import pyplot, save
from bench.shapes import LOGIT_STD, QWEN25_15B
from maskgate.worker.model import ModelConfig
from maskgate.worker.model.random_weights import random_hf_weights
from maskgate.worker.model.tiny_random import tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]
SMALL = {**QWEN25_15B, "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 4, "num_attention_heads": 4}  # fmt: skip
PROMPT = [11, 22, 33, 44, 55]
GROUP = "bench-weight-sync"


def post(url: str, path: str, body: Any, timeout: float = 900) -> tuple[int, Any]:
    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def checked(result: tuple[int, Any]) -> Any:
    status, body = result
    if status != 200 or (isinstance(body, dict) and body.get("success") is False):
        raise RuntimeError(f"worker answered {status}: {body}")
    return body


def write_checkpoint(path: Path, raw: dict[str, Any], weights: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**raw, "eos_token_id": 0}))
    save_file({k: v.cpu() for k, v in weights.items()}, str(path / "model.safetensors"))
    tiny_tokenizer().save_pretrained(str(path))  # the worker needs one; ids are all it decodes
    return path


def start_worker(ckpt: Path, device: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--model", str(ckpt), "--device", device, "--dtype", "bfloat16", "--port", str(port)]
    args += ["--max-model-len", "1024", "--max-num-seqs", "8", "--kv-memory-gb", "2"]
    args += ["--weight-update-timeout-s", "600"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKGATE_")}
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "maskgate.cli", "worker", *args],
        cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("worker did not start")
        time.sleep(0.5)


def greedy(url: str) -> list[int]:
    body = {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 16,
                                                     "ignore_eos": True}}  # fmt: skip
    return checked(post(url, "/generate", body))["output_ids"]


def sync_disk(url: str, ckpt: Path, version: str) -> None:
    checked(
        post(url, "/update_weights_from_disk", {"model_path": str(ckpt), "weight_version": version})
    )


def sync_tensor(url: str, weights: dict[str, torch.Tensor], version: str) -> float:
    """Returns the seconds spent pickling (handles only)."""
    t0 = time.perf_counter()
    named = list(weights.items())
    buf = io.BytesIO()
    ForkingPickler(buf).dump(named)
    payload = base64.b64encode(buf.getvalue()).decode()
    pickled = time.perf_counter() - t0
    body = {"serialized_named_tensors": [payload], "weight_version": version, "flush_cache": False}
    checked(post(url, "/update_weights_from_tensor", body))
    return pickled


class Broadcaster:
    """The trainer's side of update_weights_from_distributed: rank 0 of a two-rank group."""

    def __init__(self, url: str, backend: str) -> None:
        from maskgate.worker.rl.weight_group import create_group

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = url
        body = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
                "world_size": 2, "group_name": GROUP, "backend": backend}  # fmt: skip
        box: list[Any] = []
        t = threading.Thread(
            target=lambda: box.append(post(url, "/init_weights_update_group", body))
        )
        t.start()
        self.group = create_group(master_address="127.0.0.1", master_port=port, rank=0,
                                  world_size=2, group_name=GROUP, backend=backend, timeout_s=600)  # fmt: skip
        t.join()
        checked(box[0])

    def sync(self, weights: dict[str, torch.Tensor], version: str) -> None:
        body = {"names": list(weights), "dtypes": ["bfloat16"] * len(weights),
                "shapes": [list(t.shape) for t in weights.values()], "group_name": GROUP,
                "flush_cache": False, "weight_version": version}  # fmt: skip
        box: list[Any] = []
        t = threading.Thread(
            target=lambda: box.append(post(self.url, "/update_weights_from_distributed", body))
        )
        t.start()
        self.group.broadcast(list(weights.values()))
        t.join()
        checked(box[0])


def timed(fn: Any, reps: int) -> list[float]:
    out = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="a small config, on the CPU")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", help="where the checkpoints go (default: a temporary directory)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    device = "cpu" if args.small or not torch.cuda.is_available() else "cuda"
    raw = SMALL if args.small else QWEN25_15B
    name = "worker_weight_sync_small" if args.small else "worker_weight_sync"
    cfg = ModelConfig.from_hf(raw)
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="weight-sync-"))
    sets = [random_hf_weights(cfg, seed=s, logit_std=LOGIT_STD, device=device,
                              dtype=torch.bfloat16) for s in (1, 2)]  # fmt: skip
    if device == "cpu":  # shared by file name: the worker is not this process's child
        torch.multiprocessing.set_sharing_strategy("file_system")
        for w in sets:
            for t in w.values():
                t.share_memory_()
    nbytes = sum(t.nbytes for t in sets[0].values())
    t0 = time.perf_counter()
    ckpts = [write_checkpoint(tmp / f"ckpt{i}", raw, w) for i, w in enumerate(sets)]
    print(f"{len(sets[0])} tensors, {nbytes / 2**30:.2f} GiB; checkpoints written in "
          f"{time.perf_counter() - t0:.1f} s to {tmp}", flush=True)  # fmt: skip
    proc, url = start_worker(ckpts[0], device, tmp / "worker.log")
    rows: list[dict[str, Any]] = []
    outputs: dict[str, list[int]] = {}
    try:
        # Alternate A, B, ... ending on B whatever the reps (an odd count starts on A).
        order = [(args.reps - 1 - i) % 2 == 0 for i in range(args.reps)]  # True: weights B

        def run(source: str, fn: Any, **extra: Any) -> None:
            secs = timed(lambda i: fn(1 if order[i] else 0, f"{source}-{i}"), args.reps)
            outputs[source] = greedy(url)
            rows.append({"source": source, "seconds": secs, "median_s": statistics.median(secs),
                         "min_s": min(secs), "gib_per_s": nbytes / 2**30 / statistics.median(secs),
                         **extra})  # fmt: skip
            print(f"  {source}: median {statistics.median(secs):.3f} s", flush=True)

        run("disk", lambda k, v: sync_disk(url, ckpts[k], v))
        if device == "cuda":
            torch.cuda.set_device(0)
        pickling: list[float] = []
        run("tensor", lambda k, v: pickling.append(sync_tensor(url, sets[k], v)),
            ipc="cuda_ipc" if device == "cuda" else "shared_memory")  # fmt: skip
        rows[-1]["pickle_median_s"] = statistics.median(pickling)
        if device == "cpu" or torch.cuda.device_count() >= 2:
            src = sets
            if device == "cuda":  # rank 0 on the second GPU: NCCL needs distinct devices
                torch.cuda.set_device(1)
                src = [{k: t.to("cuda:1") for k, t in w.items()} for w in sets]
            bc = Broadcaster(url, "nccl" if device == "cuda" else "gloo")
            run("distributed", lambda k, v: bc.sync(src[k], v),
                backend="nccl" if device == "cuda" else "gloo")  # fmt: skip
        else:
            print("  distributed: skipped (NCCL needs a second GPU for the trainer)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        if not args.dir:  # two full checkpoints: GiBs on the device's disk
            shutil.rmtree(tmp, ignore_errors=True)
    consistent = all(o == outputs["disk"] for o in outputs.values())
    report(rows, name, args, device, raw, nbytes, consistent, Path(args.out))
    if not consistent:
        raise SystemExit(f"sources disagree on the synced weights: {outputs}")


def report(rows: list[dict[str, Any]], name: str, args: argparse.Namespace, device: str,
           raw: dict[str, Any], nbytes: int, consistent: bool, out: Path) -> None:  # fmt: skip
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else None
    print(
        f"\nfull weight sync, {nbytes / 2**30:.2f} GiB bf16, {device} {gpu or ''}, {args.reps} reps"
    )
    print(f"{'source':<12} {'median s':>9} {'min s':>8} {'GiB/s':>7}")
    for r in rows:
        print(f"{r['source']:<12} {r['median_s']:>9.3f} {r['min_s']:>8.3f} {r['gib_per_s']:>7.2f}")
    print(f"all sources gave the same greedy tokens afterwards: {consistent}")
    out.mkdir(parents=True, exist_ok=True)
    result = {"model_shape": "small" if args.small else "qwen2.5-1.5b", "config": raw,
              "device": device, "gpu": gpu, "bytes": nbytes, "reps": args.reps,
              "torch": torch.__version__, "consistent": consistent, "rows": rows}  # fmt: skip
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([r["source"] for r in rows], [r["median_s"] for r in rows], color="tab:blue")
    for i, r in enumerate(rows):
        ax.text(i, r["median_s"], f"{r['median_s']:.3g} s", ha="center", va="bottom")
    ax.set_ylabel("seconds per full sync (median)")
    ax.set_title(f"{result['model_shape']} bf16 ({nbytes / 2**30:.2f} GiB), {gpu or device}")
    save(fig, out / f"{name}.png", dpi=120)
    print(f"wrote {out / name}.json and .png")


if __name__ == "__main__":
    main()

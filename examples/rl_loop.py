"""A few steps of REINFORCE through a maskgate gateway, on the CPU: rollouts with top-p masks,
a trainer that recomputes every sampled token's log-prob, one optimiser step, and a gloo weight
sync through the gateway. It prints, per step, how far the trainer's log-probs are from the
rollout's, with the mask applied and without, and how long the sync took.

    maskgate up --model tiny-random          # or any gateway whose mask pool runs the model
    python examples/rl_loop.py --gateway http://127.0.0.1:8080 --model tiny-random

With the mask (`output_token_sampling_mask`), the trainer renormalises its distribution over the
ids top-p could have drawn from and must agree with `output_token_sampling_logprobs` to float
tolerance. Without it, the trainer's full-vocabulary log-prob is compared with the same
sampling log-prob: the ratio is biased wherever top-p cut the support. When the workers return
SGLang's raw `output_token_logprobs` (`return_logprob`), the full-vocabulary log-prob is also
checked against them.

The trainer is plain torch (transformers' Llama) over the same weights as the workers; the
sync is `/init_weights_update_group` once and `/update_weights_from_distributed` per step, both
on the gateway, which forwards them to every worker of its trained pool (docs/rl.md).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import torch

GROUP = "rl-loop"
TOLERANCE = 1e-3  # |masked trainer log-prob - rollout log-prob| allowed (float32 on both sides)


def http(args: argparse.Namespace, path: str, body: Any = None, admin: bool = False) -> Any:
    """One gateway call; raises RuntimeError with the gateway's answer when it is not 2xx."""
    key = args.admin_key if admin else args.api_key
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        args.gateway + path, data, headers, method="GET" if body is None else "POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{path}: {e.code} {e.read().decode(errors='replace')}") from None
    return json.loads(raw) if raw else None


def background(fn: Any) -> tuple[threading.Thread, list[Any]]:
    """Run `fn` in a thread; its result or exception lands in the box."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except Exception as e:  # re-raised by the caller after join
            box.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def joined(thread: threading.Thread, box: list[Any]) -> Any:
    thread.join()
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


def load_trainer_model(spec: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    path = spec
    if spec == "tiny-random":
        from maskgate.worker.model import save_tiny_random

        path = str(save_tiny_random(Path(tempfile.mkdtemp(prefix="rl-loop-")) / "tiny-random"))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def rollouts(args: argparse.Namespace, vocab: int, version: str, gen: torch.Generator) -> list:
    prompts = torch.randint(3, vocab, (args.batch, args.prompt_len), generator=gen).tolist()
    body: dict[str, Any] = {
        "input_ids": prompts,
        "sampling_params": {
            "temperature": args.temperature,
            "top_p": args.top_p,
            "max_new_tokens": args.max_new_tokens,
            "ignore_eos": True,
        },
        "return_sampling_mask": True,
        "min_weight_version": version,  # never served by weights older than the last sync
    }
    if args.raw_logprobs:
        body["return_logprob"] = True
    try:
        items = http(args, "/generate", body)
    except RuntimeError as e:
        if not (args.raw_logprobs and "return_logprob" in str(e)):
            raise
        print("the workers do not return raw log-probs (return_logprob): that check is skipped")
        args.raw_logprobs = False
        del body["return_logprob"]
        items = http(args, "/generate", body)
    for item in items:
        meta = item["meta_info"]
        spans = meta.get("weight_versions") or [{"version": meta["weight_version"]}]
        if meta["weight_version"] != version or any(s["version"] != version for s in spans):
            raise RuntimeError(f"a rollout at {spans}, expected version {version} throughout")
    return list(zip(prompts, items, strict=True))


def token_logprobs(model: torch.nn.Module, prompt: list[int], item: dict, temperature: float):
    """(masked, full) trainer log-probs of each sampled token, with gradients."""
    out = item["output_ids"]
    ids = torch.tensor([prompt + out])
    logits = model(ids).logits[0, len(prompt) - 1 : -1] / temperature  # [T, V]
    full = torch.log_softmax(logits, dim=-1)
    tokens = torch.tensor(out)
    full_lp = full.gather(1, tokens[:, None])[:, 0]
    masked = []
    for t, support in enumerate(item["meta_info"]["output_token_sampling_mask"]):
        support_ids = torch.tensor(support)
        renorm = torch.log_softmax(logits[t, support_ids], dim=-1)
        masked.append(renorm[(support_ids == out[t]).nonzero()[0, 0]])
    return torch.stack(masked), full_lp


def mismatch(trainer: torch.Tensor, rollout: torch.Tensor) -> dict[str, float]:
    """|delta| mean and max, and the k3 estimate of KL(rollout || trainer) on sampled tokens."""
    delta = trainer - rollout
    ratio = delta.clamp(max=50)
    return {
        "mean_abs": float(delta.abs().mean()),
        "max_abs": float(delta.abs().max()),
        "kl": float((ratio.exp() - 1 - ratio).mean()),
    }


class Sync:
    """The trainer's end of the gloo group every worker of the gateway's pool joins."""

    def __init__(self, args: argparse.Namespace, model: torch.nn.Module) -> None:
        from maskgate.worker.rl.weight_group import create_group

        self.args, self.model = args, model
        ranks = http(args, "/get_world_size")["world_size"]
        with socket.socket() as s:
            s.bind((args.master_address, 0))
            port = s.getsockname()[1]
        init = {"master_address": args.master_address, "master_port": port, "rank_offset": 1,
                "world_size": 1 + ranks, "group_name": GROUP, "backend": "gloo"}  # fmt: skip
        # Every worker waits in the rendezvous for rank 0: send the call, then join.
        call = background(lambda: http(args, "/init_weights_update_group", init, admin=True))
        self.group = create_group(master_address=args.master_address, master_port=port, rank=0,
                                  world_size=1 + ranks, group_name=GROUP, backend="gloo",
                                  timeout_s=300)  # fmt: skip
        joined(*call)
        self.ranks = ranks

    def push(self, version: str) -> float:
        """Broadcast every parameter while the gateway updates the pool; seconds taken."""
        params = {n: t.detach().contiguous() for n, t in self.model.state_dict().items()}
        body = {"names": list(params), "dtypes": ["float32"] * len(params),
                "shapes": [list(t.shape) for t in params.values()], "group_name": GROUP,
                "weight_version": version}  # fmt: skip
        start = time.perf_counter()
        call = background(
            lambda: http(self.args, "/update_weights_from_distributed", body, admin=True)
        )
        self.group.broadcast(list(params.values()))
        joined(*call)  # 200 only when every worker loaded them
        return time.perf_counter() - start

    def close(self) -> None:
        http(self.args, "/destroy_weights_update_group", {"group_name": GROUP}, admin=True)
        self.group.destroy()


def next_version(current: str | None) -> int:
    return int(current) + 1 if current is not None and current.isdigit() else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="tiny-random", help="tiny-random or a HF directory")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--admin-key", default="")
    ap.add_argument("--master-address", default="127.0.0.1", help="this host, as workers see it")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the per-step results here")
    ap.add_argument("--no-raw-logprobs", dest="raw_logprobs", action="store_false",
                    help="do not ask for return_logprob (workers without it)")  # fmt: skip
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    model = load_trainer_model(args.model)
    vocab = model.config.vocab_size
    optim = torch.optim.Adam(model.parameters(), lr=args.lr)
    sync = Sync(args, model)
    # The pool first gets the trainer's weights, whatever it served before.
    version = next_version(http(args, "/get_weight_version")["pool_weight_version"])
    sync_s = sync.push(str(version))
    print(f"{sync.ranks} workers; initial sync to version {version} in {sync_s:.3f} s")
    header = "step version tokens | masked |d| mean / max / KL | no mask |d| mean / max / KL"
    print(header + " | raw |d| max | sync s")
    results, ok = [], True
    for step in range(args.steps):
        batch = rollouts(args, vocab, str(version), gen)
        masked_all, full_all, rollout_all, raw_all, loss = [], [], [], [], 0.0
        rewards = torch.tensor(
            [
                sum(t % 2 == 0 for t in item["output_ids"]) / len(item["output_ids"])
                for _, item in batch
            ]
        )  # a toy reward: the share of even token ids
        advantages = rewards - rewards.mean()
        for (prompt, item), adv in zip(batch, advantages, strict=True):
            masked, full = token_logprobs(model, prompt, item, args.temperature)
            meta = item["meta_info"]
            rollout = torch.tensor(meta["output_token_sampling_logprobs"])
            masked_all.append(masked.detach())
            full_all.append(full.detach())
            rollout_all.append(rollout)
            if meta.get("output_token_logprobs"):
                raw_all.append(torch.tensor([x[0] for x in meta["output_token_logprobs"]]))
            # REINFORCE on the policy the rollout sampled from: the truncated distribution.
            loss = loss - adv * masked.sum() / len(batch)
        optim.zero_grad()
        loss.backward()
        optim.step()
        masked_d = mismatch(torch.cat(masked_all), torch.cat(rollout_all))
        full_d = mismatch(torch.cat(full_all), torch.cat(rollout_all))
        raw_max = float((torch.cat(full_all) - torch.cat(raw_all)).abs().max()) if raw_all else None
        version += 1
        sync_s = sync.push(str(version))
        tokens = sum(len(r) for r in rollout_all)
        raw_text = "n/a" if raw_max is None else f"{raw_max:.2e}"
        print(
            f"{step:4d} {version - 1:7d} {tokens:6d} | {masked_d['mean_abs']:.2e} / "
            f"{masked_d['max_abs']:.2e} / {masked_d['kl']:.2e} | {full_d['mean_abs']:.2e} / "
            f"{full_d['max_abs']:.2e} / {full_d['kl']:.2e} | {raw_text} | {sync_s:.3f}"
        )
        ok &= masked_d["max_abs"] <= TOLERANCE and (raw_max is None or raw_max <= TOLERANCE)
        results.append({"step": step, "rollout_version": str(version - 1), "tokens": tokens,
                        "masked": masked_d, "unmasked": full_d, "raw_max_abs": raw_max,
                        "reward": float(rewards.mean()), "sync_s": sync_s})  # fmt: skip
    # The last sync's weights serve the next rollouts.
    rollouts(args, vocab, str(version), gen)
    sync.close()
    if args.json is not None:
        args.json.write_text(json.dumps({"steps": results, "tolerance": TOLERANCE}, indent=2))
    if not ok:
        print(f"trainer and rollout log-probs differ by more than {TOLERANCE}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Logit rows of a real language model, for the kernels' GPU tests: SmolLM2-135M-
Instruct (V = 49152, the project's embedded model) sampling answers to varied chat prompts at
temperature 1 with nothing truncated, the way an RL rollout samples. Each generated step's
raw float32 logits become one row.

    python -m bench.real_rows [--steps 32] [--out .cache/real_rows/smollm2.pt]

The model is the worker's converted copy (PyPI package, converted once), run on the CPU by
transformers, seeded: the same file every run. The rows are saved as float16 (their range is
a few tens, so float16 keeps 11 bits of each) with the prompts and the sampled tokens.
tests/gpu/test_kernels_gpu.py reads them (MASKGATE_REAL_ROWS, by default the path above).
Prints the rows' entropy and top-p support sizes.
"""

from __future__ import annotations

import argparse
import pathlib

import torch

DEFAULT_PATH = pathlib.Path(".cache/real_rows/smollm2.pt")
STEPS = 32
PROMPTS = (
    "Write a short poem about the sea.",
    "What is the capital of Australia?",
    "Explain how a hash table works.",
    "Give me three ideas for a birthday party.",
    "Translate 'good morning, how are you?' into French.",
    "Write a Python function that reverses a list.",
    "Why is the sky blue?",
    "Tell me a story about a dragon who is afraid of the dark.",
    "What is 17 times 23? Show your steps.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "List some healthy breakfast foods.",
    "How do I make a cup of green tea?",
    "What are the pros and cons of remote work?",
    "Describe the colour red to someone who cannot see.",
    "Write an email asking my manager for a day off.",
    "What causes earthquakes?",
    "Suggest a name for a black cat.",
    "Explain recursion to a ten year old.",
    "What should I pack for a weekend hiking trip?",
    "Write a haiku about autumn leaves.",
    "What is the difference between weather and climate?",
    "Give me a recipe that uses eggs, spinach and cheese.",
    "Who wrote Pride and Prejudice, and what is it about?",
    "Write a limerick about a programmer.",
    "How does photosynthesis work?",
    "Plan a one day visit to Paris.",
    "What is a prime number? Give examples.",
    "Describe your ideal city.",
    "Write the opening line of a mystery novel.",
    "How can I improve my sleep?",
    "Explain what a neural network is in simple words.",
    "Invent a new board game and describe its rules.",
)


def generate(steps: int = STEPS, seed: int = 0) -> dict:
    """Sample `steps` tokens for every prompt (one batch, left-padded) and keep each step's
    logits: [len(PROMPTS) * steps, V] float32, prompt-major."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maskgate.worker.model.gguf_convert import ensure_smollm2

    path = ensure_smollm2(progress=print)  # the worker's converted copy (download once)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in PROMPTS
    ]
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(texts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=steps,
            min_new_tokens=steps,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tok.pad_token_id,
        )
    logits = torch.stack(out.logits, 1).float()  # [prompts, steps, V]
    return {
        "model": "SmolLM2-135M-Instruct",
        "prompts": list(PROMPTS),
        "tokens": out.sequences[:, enc["input_ids"].shape[1] :],
        "logits": logits.reshape(-1, logits.shape[-1]),
    }


def save(data: dict, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**data, "logits": data["logits"].half()}, path)


def support_sizes(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """|S| of each row under top-p alone at temperature 1 (float64, design order)."""
    p = z.double().softmax(-1).sort(dim=-1, descending=True).values
    return ((p.cumsum(-1) - p) < top_p).sum(-1)


def describe(name: str, z: torch.Tensor) -> dict:
    """Quantiles of the rows' entropy (nats) and top-p supports, and the widest supports."""
    logp = z.double().log_softmax(-1)
    h = -(logp.exp() * logp).nan_to_num().sum(-1)
    out = {"rows": name, "n": z.shape[0]}
    qs = torch.tensor([0.1, 0.5, 0.9, 0.99])
    out["entropy_nats"] = [round(v, 2) for v in h.double().quantile(qs.double()).tolist()]
    for p in (0.9, 0.95):
        s = support_sizes(z, p).double()
        out[f"support_p{p}"] = [int(v) for v in s.quantile(qs.double()).tolist()]
        out[f"support_p{p}_max"] = int(s.max())
        out[f"support_p{p}_over_1024"] = int((s > 1024).sum())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_PATH)
    args = ap.parse_args()
    data = generate(args.steps)
    save(data, args.out)
    real = data["logits"]
    print(f"saved {tuple(real.shape)} rows to {args.out}")
    print("quantiles 10/50/90/99%: entropy (nats), top-p 0.9 and 0.95 support sizes")
    print(describe("smollm2", real))


if __name__ == "__main__":
    main()

"""tiny-random: deterministic, self-contained, peaked, and identical once written to disk."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from maskgate.worker.engine.batch import RowWork
from maskgate.worker.model import load, save_tiny_random
from maskgate.worker.model.tiny_random import tiny_weights
from maskgate.worker.runner.runner import ModelRunner


def test_weights_and_tokenizer_are_deterministic() -> None:
    a, b = tiny_weights(), tiny_weights()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    t1, t2 = load("tiny-random").tokenizer, load("tiny-random").tokenizer
    assert t1.backend_tokenizer.to_str() == t2.backend_tokenizer.to_str()


def test_tokenizer_round_trips_any_text_and_has_a_chat_template() -> None:
    loaded = load("tiny-random")
    tok = loaded.tokenizer
    assert len(tok) == loaded.vocab_size == 512
    for text in ("Hello world!", "ünïcode 🚀 and\ttabs\n", "x = x * 2 + 1"):
        assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Paint a hill."}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nPaint a hill.<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") in loaded.eos_token_ids
    assert loaded.eos_token_ids == frozenset({0, 2})


def test_logits_are_peaked_enough_for_top_p_masks() -> None:
    runner = ModelRunner("tiny-random", max_num_slots=1, max_model_len=64)
    ids = torch.randint(3, 512, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    sizes = []
    for pos, tok in enumerate(ids):
        logits = runner.logits([RowWork(0, [tok], pos, sample=True)])[0]
        p = logits.softmax(-1).sort(descending=True).values
        sizes.append(int(((p.cumsum(0) - p) < 0.9).sum()))
    # A flat row would need ~460 of 512 ids for 90% of the mass.
    assert min(sizes) >= 1 and sum(sizes) / len(sizes) < 100


def test_saved_directory_loads_in_transformers_and_here(tmp_path: Path) -> None:
    path = save_tiny_random(tmp_path / "tiny")
    ids = [1, 300, 45, 46, 2, 9]
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    for spec in ("tiny-random", str(path)):
        runner = ModelRunner(spec, max_num_slots=1, max_model_len=32)
        got = runner.logits([RowWork(0, ids, 0, sample=True)])[0]
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    tok = AutoTokenizer.from_pretrained(str(path))
    assert tok.encode("a robot") == load("tiny-random").tokenizer.encode("a robot")
    assert load(str(path)).eos_token_ids == frozenset({0, 2})

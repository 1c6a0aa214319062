"""The decoder's shape, parsed from a Hugging Face `config.json` (Llama family only).

One parser for every supported architecture; an unsupported feature is an error at load time,
never a silently different model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# model_type -> (q/k/v projections have a bias by default, per-head q/k RMSNorm)
_ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}
_ROPE_TYPES = ("default", "linear", "llama3")


class ModelConfigError(ValueError):
    """The checkpoint's config.json describes a model this worker cannot run."""


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    kind: str = "default"  # one of _ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    sliding_window: int | None  # keys older than this many positions are not attended

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse a config.json dict (transformers v4 or v5 layout)."""
        model_type = raw.get("model_type")
        if model_type not in _ARCHITECTURES:
            raise ModelConfigError(
                f"model_type {model_type!r} is not supported; supported: {sorted(_ARCHITECTURES)}"
            )
        default_bias, qk_norm = _ARCHITECTURES[model_type]
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"hidden_act {act!r} is not supported (only 'silu')")
        if raw.get("mlp_bias", False):
            raise ModelConfigError("mlp_bias=true is not supported")
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            cfg = cls(
                model_type=model_type,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                rope=_parse_rope(raw),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=bool(raw.get("attention_bias", default_bias)),
                qk_norm=qk_norm,
                sliding_window=_parse_sliding_window(raw),
            )
        except KeyError as e:
            raise ModelConfigError(f"config.json lacks required field {e.args[0]!r}") from None
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {cfg.num_key_value_heads}"
            )
        return cfg


def _parse_rope(raw: dict[str, Any]) -> RopeConfig:
    # transformers v5 writes `rope_parameters` (theta inside); v4 writes `rope_theta` plus an
    # optional `rope_scaling` dict whose type key is `rope_type` (or the older `type`).
    params = dict(raw.get("rope_scaling") or {})
    params.update(raw.get("rope_parameters") or {})
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelConfigError("partial_rotary_factor != 1 is not supported")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise ModelConfigError(f"rope type {kind!r} is not supported; supported: {_ROPE_TYPES}")
    if kind == "default":
        return RopeConfig(theta=theta)
    factor = float(params["factor"])
    if kind == "linear":
        return RopeConfig(theta=theta, kind=kind, factor=factor)
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=factor,
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


def _parse_sliding_window(raw: dict[str, Any]) -> int | None:
    # Mistral applies `sliding_window` when set; Qwen2/Qwen3 only when `use_sliding_window`.
    window = raw.get("sliding_window")
    # Qwen layers with index >= max_window_layers slide; only all-or-none is supported.
    if raw.get("model_type") in ("qwen2", "qwen3"):
        first_sliding = int(raw.get("max_window_layers", 0))
        if not raw.get("use_sliding_window", False) or first_sliding >= raw["num_hidden_layers"]:
            return None
        if first_sliding > 0:
            raise ModelConfigError(
                "per-layer sliding windows (max_window_layers) are not supported"
            )
    return int(window) if window else None

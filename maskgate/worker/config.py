"""The worker's one typed configuration: YAML file < MASKGATE_WORKER_* env < CLI flags.

Built once by `load_config` through `gateway.settings.load_settings` (the one conversion
path) and passed down explicitly. Unknown keys are errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from maskgate.protocol.settings import load_settings

ENV_PREFIX = "MASKGATE_WORKER_"

Role = Literal["mask", "general", "mixed"]


class WorkerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Model: a Hugging Face directory, a .gguf file, `tiny-random` (tests) or `smollm2`.
    model: str = "tiny-random"
    # Where converted models (smollm2, .gguf files) are cached; None: ~/.cache/maskgate.
    cache_dir: str | None = None
    served_model_name: str | None = None  # name in /v1/models; default: derived from `model`
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    role: Role = "mixed"  # mask: only mask requests; general: refuses them; mixed: both

    host: str = "127.0.0.1"
    port: int = Field(30000, ge=0, le=65535)  # 0: pick a free port (printed at start)

    # Memory budget and batch limits.
    kv_memory_gb: float | None = Field(None, gt=0)  # KV cache budget; None: the runner decides
    max_model_len: int | None = Field(None, ge=2)  # tokens per sequence; None: model's limit
    max_num_seqs: int = Field(64, ge=1)  # sequences decoding at once
    max_prefill_tokens: int = Field(2048, ge=1)  # prompt tokens fed per step (chunk size)
    # The prefix cache (docs/worker.md): prompts sharing a prefix copy its K/V, computed once.
    disable_radix_cache: bool = False
    # The overlap schedule (docs/worker.md): step N + 1 is launched before step N's results
    # are post-processed. Off: one step at a time, for debugging.
    disable_overlap_schedule: bool = False
    cuda_graphs: bool = True  # capture decode batch buckets as CUDA graphs (CUDA only)
    # The Triton kernels of maskgate/worker/model (fused norm, rope + KV store, SiLU-mul, decode
    # attention) on CUDA; false: the torch path, the before/after switch (CUDA only).
    fused_kernels: bool = True
    # torch intra-op threads (CPU compute); None: torch's default (all cores). Several
    # workers on one machine must split the cores: oversubscribed OpenMP threads made a
    # CPU decode step up to 10x slower.
    cpu_threads: int | None = Field(None, ge=1)

    # Masks (docs/design.md: Mask semantics, and the Policy the worker applies to its input).
    max_mask_tokens: int = Field(4096, ge=1)  # cap C on |mask| per token
    max_mask_ids_per_request: int = Field(64 * 1024 * 1024, ge=1)
    reject_logit_transforms: bool = True
    # kernel: the row-filtered kernels (kernels.sample). sort_all_rows: the benchmark baseline
    # (maskgate/worker/sort_all.py), a full-vocabulary sort of every row whenever any row asks.
    mask_impl: Literal["kernel", "sort_all_rows"] = "kernel"

    # RL weight updates (docs/worker.md, "Weight updates"). The version reported in
    # meta_info.weight_version until an update names another.
    weight_version: str = "default"
    # Bound on every wait of a weight-update group: forming it, and one
    # update_weights_from_distributed's broadcasts. A trainer that dies or never joins fails
    # the call after this long; the worker keeps serving the old weights.
    weight_update_timeout_s: float = Field(300.0, gt=0)

    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    # /generate streams: cumulative text/ids/meta_info per chunk (SGLang default) or deltas.
    incremental_streaming_output: bool = False
    # SIGTERM: stop listening, give in-flight requests this long to finish, then stop.
    shutdown_grace_s: float = Field(60.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"


def load_config(
    *,
    file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """Raises gateway.settings.ConfigError naming every bad field."""
    return load_settings(
        WorkerConfig,
        file=file,
        env=os.environ if env is None else env,
        env_prefix=ENV_PREFIX,
        overrides=overrides,
    )

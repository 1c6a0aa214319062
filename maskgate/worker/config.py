"""The worker's one typed configuration: YAML file < MASKGATE_WORKER_* env < CLI flags.

Built once by `load_config` through `gateway.settings.load_settings` (the one conversion
path) and passed down explicitly. Unknown keys are errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from maskgate.protocol.policy_settings import policy_field
from maskgate.protocol.settings import load_settings

ENV_PREFIX = "MASKGATE_WORKER_"
# Read verbatim, never as YAML scalars: a key such as `12345` or `yes` stays that string.
RAW_ENV = {"api_key": ENV_PREFIX + "API_KEY", "admin_api_key": ENV_PREFIX + "ADMIN_API_KEY"}

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
    # The policy's own fields (protocol/policy_settings.py), read there by `policy_from`.
    max_mask_tokens: int = policy_field("max_mask_tokens")  # cap C on |mask| per token
    max_mask_ids_per_request: int = policy_field("max_mask_ids_per_request")
    reject_logit_transforms: bool = policy_field("reject_logit_transforms")
    # kernel: the row-filtered kernels (kernels.sample). sort_all_rows: the benchmark baseline
    # (maskgate/kernels/sort_all.py), a full-vocabulary sort of every row whenever any row asks.
    mask_impl: Literal["kernel", "sort_all_rows"] = "kernel"

    # RL weight updates (docs/worker.md, "Weight updates"). The version reported in
    # meta_info.weight_version until an update names another.
    weight_version: str = "default"
    # Bound on every wait of a weight-update group: forming it, and one
    # update_weights_from_distributed's broadcasts. A trainer that dies or never joins fails
    # the call after this long; the worker keeps serving the old weights.
    weight_update_timeout_s: float = Field(300.0, gt=0)

    # Keys, as SGLang's --api-key / --admin-api-key (docs/worker.md, "Keys"): inference routes
    # take the api key when one is set; control routes the admin key, else the api key.
    api_key: SecretStr | None = None
    admin_api_key: SecretStr | None = None

    # Bounds checked before any work is queued (docs/worker.md, "Bounds").
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_sequences_per_request: int = Field(1024, ge=1)  # prompts x n, summed over items
    max_prompt_bytes: int = Field(4 * 1024 * 1024, ge=1)  # UTF-8 text of all prompts, untokenized
    max_top_logprobs_num: int = Field(20, ge=0, le=1024)  # /generate top_logprobs_num; OpenAI: 20
    max_prompt_logprob_rows: int = Field(32768, ge=0)  # scored prompt positions x n, summed
    # /health_generate (and /health after non-finite logits): the 1-token probe's deadline.
    health_check_timeout_s: float = Field(20.0, gt=0)
    # /generate streams: cumulative text/ids/meta_info per chunk (SGLang default) or deltas.
    incremental_streaming_output: bool = False
    # SIGTERM: stop listening, give in-flight requests this long to finish, then stop.
    shutdown_grace_s: float = Field(60.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("api_key", "admin_api_key")
    @classmethod
    def _non_empty(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            raise ValueError("must not be empty (leave it unset for no key)")
        return value


def load_config(
    *,
    file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """Raises gateway.settings.ConfigError naming every bad field."""
    env = os.environ if env is None else env
    raw = {field: env[name] for field, name in RAW_ENV.items() if name in env}
    return load_settings(
        WorkerConfig,
        file=file,
        env={k: v for k, v in env.items() if k not in RAW_ENV.values()},
        env_prefix=ENV_PREFIX,
        overrides={**raw, **(overrides or {})},
    )

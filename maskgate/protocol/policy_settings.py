"""The mask policy's settings: one model, each default written once (docs/config.md).

The gateway reads it whole under its `policy:` key (`GatewayConfig.policy`). The worker
exposes three of its fields at its own top level (`--max-mask-tokens`, `max_mask_ids_per_
request`, `reject_logit_transforms`) with the same types, bounds and defaults
(`policy_field`) and builds the model from them (`policy_from`); the rest keep their
defaults there. The policy's functions (policy.py) take the model itself.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

MAX_MASK_TOKENS = 4096  # cap C on |mask| per token (rule 8); the default of every cap flag


class PolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_mask_tokens: int = Field(default=MAX_MASK_TOKENS, ge=1)  # rule 8
    max_mask_ids_per_request: int = Field(default=64 * 1024 * 1024, ge=1)  # rule 9, in ids
    reject_logit_transforms: bool = True  # rule 6
    # Used by rule 9 when a request leaves max_tokens unset (the upstream default is unknown).
    default_max_tokens: int = Field(default=2048, ge=1)
    # Most prompts in one mask request (a /generate batch, a /v1/completions prompt list;
    # 413 sampling_mask_batch_too_large above it): checking costs O(items), and this keeps
    # one request's check well under 50 ms.
    max_batch_items: int = Field(default=4096, ge=1)

    def to_policy(self) -> PolicySettings:
        """What the policy's functions take: this model itself."""
        return self


def policy_field(name: str) -> Any:
    """A copy of one field's definition (type bound and default), for a model that exposes
    it under its own name."""
    info: FieldInfo = PolicySettings.model_fields[name]
    return copy.copy(info)


def policy_from(config: BaseModel) -> PolicySettings:
    """The policy settings of a model that exposes some of their fields (the worker's): those
    it has, the defaults for the rest."""
    have = type(config).model_fields
    return PolicySettings(
        **{k: getattr(config, k) for k in PolicySettings.model_fields if k in have}
    )

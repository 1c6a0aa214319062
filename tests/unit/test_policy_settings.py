"""One settings model for the mask policy (protocol/policy_settings.py), read by the gateway's
`policy:` section and the worker's top-level policy fields alike."""

from __future__ import annotations

import pytest

from maskgate.gateway.config import GatewayConfig
from maskgate.protocol.policy import PolicyConfig
from maskgate.protocol.policy_settings import MAX_MASK_TOKENS, PolicySettings, policy_from
from maskgate.protocol.settings import ConfigError
from maskgate.worker.config import WorkerConfig, load_config
from maskgate.worker.server.state import policy_config

WORKER_FIELDS = ("max_mask_tokens", "max_mask_ids_per_request", "reject_logit_transforms")


def test_the_gateway_and_the_policy_take_the_same_model() -> None:
    assert PolicyConfig is PolicySettings
    assert isinstance(GatewayConfig().policy, PolicySettings)
    assert GatewayConfig().policy == PolicySettings()
    assert PolicySettings().max_mask_tokens == MAX_MASK_TOKENS == 4096


@pytest.mark.parametrize("name", WORKER_FIELDS)
def test_worker_fields_are_the_policy_fields(name: str) -> None:
    mine = WorkerConfig.model_fields[name]
    theirs = PolicySettings.model_fields[name]
    assert (mine.annotation, mine.default, mine.metadata) == (
        theirs.annotation,
        theirs.default,
        theirs.metadata,
    )


def test_worker_policy_is_built_from_its_fields() -> None:
    cfg = WorkerConfig.model_validate(
        {"max_mask_tokens": 64, "max_mask_ids_per_request": 10, "reject_logit_transforms": False}
    )
    got = policy_config(cfg)
    assert got == PolicySettings(
        max_mask_tokens=64, max_mask_ids_per_request=10, reject_logit_transforms=False
    )
    assert got == policy_from(cfg)
    assert policy_config(WorkerConfig.model_validate({})) == PolicySettings()


def test_worker_bounds_come_from_the_policy() -> None:
    with pytest.raises(ConfigError, match="max_mask_tokens"):
        load_config(overrides={"max_mask_tokens": 0}, env={})
    with pytest.raises(ConfigError, match="max_batch_items"):  # not a worker key
        load_config(overrides={"max_batch_items": 5}, env={})


def test_policy_settings_refuse_unknown_keys() -> None:
    with pytest.raises(ValueError, match="max_mask_token"):
        PolicySettings.model_validate({"max_mask_token": 5})

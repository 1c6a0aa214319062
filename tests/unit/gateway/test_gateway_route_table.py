"""The route table (routes.py) and what is read from it: every row's access level, the
OpenAPI document, the leader's forwarding list, and the SGLang routes it never serves."""

from __future__ import annotations

import pytest

from maskgate.gateway import GatewayConfig
from maskgate.gateway.clients.access import Access
from maskgate.gateway.cluster.leader_middleware import leader_path
from maskgate.gateway.openapi import openapi_spec
from maskgate.gateway.routes import PROXIED, admin_table, leader_paths, main_table
from maskgate.protocol.policy import Route
from maskgate.protocol.settings import ConfigError, load_settings


def config(**overrides: object) -> GatewayConfig:
    return load_settings(GatewayConfig, overrides=overrides)


FULL = {"host": "127.0.0.1", "admin_key": "adm"}
# SGLang's admin, debug and unclassified routes: never served with a client key.
NEVER = [
    "/get_weights_by_name",
    "/load_lora_adapter",
    "/unload_lora_adapter",
    "/start_profile",
    "/stop_profile",
    "/freeze_gc",
    "/get_internal_state",
    "/set_internal_state",
    "/get_server_info",
    "/configure_logging",
    "/dump_expert_distribution_record",
    "/start_expert_distribution_record",
    "/slow_down",
    "/open_session",
    "/close_session",
    "/update_weights_from_ipc",
    "/init_weights_send_group_for_remote_instance",
    "/send_weights_to_remote_instance",
    "/clear_hicache_storage_backend",
    "/vertex_generate",
    "/generate_from_file",
    "/v1/responses",
    "/v1/rerank",
    "/v1/score",
    "/encode",
    "/classify",
    "/v1/classify",
    "/parse_function_call",
    "/separate_reasoning",
]


def test_no_client_row_reaches_an_sglang_admin_or_debug_route():
    for rows in (main_table(config(**FULL)), admin_table()):
        paths = {row.path for row in rows}
        assert not paths & set(NEVER)
        for row in rows:
            if row.path.startswith(("/update_weights", "/init_weights", "/release_memory")):
                assert row.access is Access.CONTROL, row.path


def test_every_route_with_sampling_parameters_is_classified():
    by_path = {row.path: row for row in PROXIED}
    for path, route in (
        ("/v1/chat/completions", Route.CHAT),
        ("/v1/completions", Route.COMPLETIONS),
        ("/generate", Route.GENERATE),
        ("/invocations", Route.CHAT),
    ):
        assert by_path[path].policy is route
    assert by_path["/generate"].methods == ("POST", "PUT")
    assert by_path["/invocations"].upstream == "/v1/chat/completions"
    unclassified = {row.path for row in PROXIED if row.policy is None}
    assert unclassified == {
        "/v1/models",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
        "/v1/tokenize",
        "/v1/detokenize",
    }
    assert all(row.access is Access.CLIENT for row in PROXIED)


@pytest.mark.parametrize(
    "overrides",
    [FULL, {"host": "127.0.0.1"}, {}, {"host": "127.0.0.1", "metrics_port": 9100}],
)
def test_the_openapi_document_and_the_forwarding_list_match_the_table(overrides):
    rows = main_table(config(**overrides))
    spec = openapi_spec(rows)
    documented = {
        (path, method)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method != "parameters"
    }
    declared = {
        (row.path.replace(":.+", ""), method.lower())
        for row in rows
        if row.documented
        for method in row.methods
    }
    assert documented == declared
    for row in rows:
        if row.documented:
            path = row.path.replace(":.+", "")
            for method in row.methods:
                assert spec["paths"][path][method.lower()]["x-maskgate-access"] == row.access
    paths = leader_paths(rows)
    for row in rows:
        probe = row.path.replace("{worker_id:.+}", "x").replace("{pool}", "mask")
        assert leader_path(paths, probe) == row.forwarded_to_leader, row.path


def test_the_table_follows_the_configuration():
    def paths(**overrides: object) -> set[str]:
        return {row.path for row in main_table(config(**overrides))}

    assert {"/pause_generation", "/workers", "/admin/pools"} <= paths(**FULL)
    # On 0.0.0.0 with no admin key and no trusted network beyond loopback: control is off.
    assert not {"/pause_generation", "/workers"} & paths()
    assert "/admin/pools" not in paths(host="127.0.0.1")
    assert "/pause_generation" in paths(trusted_networks=["10.0.0.0/8"])
    assert "/pause_generation" in paths(insecure_control=True)
    assert "/pause_generation" not in paths(host="127.0.0.1", control={"enabled": False})
    assert "/metrics" not in paths(metrics_port=9100)


def test_control_that_cannot_be_secured_refuses_to_start():
    with pytest.raises(ConfigError) as info:
        config(control={"enabled": True})
    message = str(info.value)
    for setting in ("admin_key", "trusted_networks", "insecure_control", "control.enabled"):
        assert setting in message
    for overrides in (
        {"admin_key": "adm"},
        {"trusted_networks": ["10.0.0.0/8"]},
        {"insecure_control": True},
        {"host": "::1"},
    ):
        assert config(control={"enabled": True}, **overrides).control_enabled()
    with pytest.raises(ConfigError):
        config(trusted_networks=["not a network"])
    assert config().trusted_networks == ["127.0.0.0/8", "::1/128"]

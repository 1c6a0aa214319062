"""The gateway's one configuration path: file < environment < flags, field-level errors."""

from __future__ import annotations

import pytest

from maskgate.gateway.cli import build_parser, main, overrides_from
from maskgate.gateway.config import GatewayConfig
from maskgate.protocol.settings import ConfigError, load_settings


def load(**kw):
    return load_settings(GatewayConfig, **kw)


def test_defaults_are_a_valid_config():
    c = load()
    assert (c.port, c.workers, c.policy.max_mask_tokens) == (8080, "auto", 4096)
    assert (c.clients.header_timeout_s, c.clients.max_connections) == (10.0, 10000)
    assert c.pools.mask.max_concurrency == 256 and c.pools.general.health_path == "/health"
    assert c.pools.general.unhealthy_threshold == 3 and c.pools.general.healthy_threshold == 2


def test_file_then_env_then_flags(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("port: 9000\npools:\n  mask:\n    endpoints: [http://m:1]\n    max_queue: 5\n")
    env = {"MASKGATE_PORT": "9100", "MASKGATE_POOLS__MASK__MAX_QUEUE": "7", "OTHER": "x"}
    args = build_parser().parse_args(["--port", "9200", "--mask-endpoint", "http://m:2/"])
    c = load(file=path, env=env, overrides=overrides_from(args))
    assert c.port == 9200
    assert c.pools.mask.max_queue == 7
    assert c.pools.mask.endpoints == ["http://m:2"]  # flags replace the list, normalised


def test_flags_map_onto_config_fields():
    args = build_parser().parse_args(
        ["--general-endpoint", "http://a:1", "--general-endpoint", "http://b:2",
         "--max-mask-tokens", "64", "--api-key", "k1", "--api-key", "k2", "--workers", "3",
         "--mask-dns", "mask.svc", "--no-access-log", "--client-header-timeout", "2.5",
         "--client-body-timeout", "4", "--client-body-deadline", "60", "--client-idle-timeout", "9",
         "--max-client-connections", "77"]
    )  # fmt: skip
    c = load(overrides=overrides_from(args))
    assert c.pools.general.endpoints == ["http://a:1", "http://b:2"]
    assert c.policy.max_mask_tokens == 64 and c.policy.to_policy().max_mask_tokens == 64
    assert c.api_keys == ["k1", "k2"] and c.workers == 3 and not c.access_log
    assert c.pools.mask.dns == "mask.svc"
    assert c.clients.model_dump() == {
        "header_timeout_s": 2.5, "body_timeout_s": 4.0, "body_deadline_s": 60.0,
        "idle_timeout_s": 9.0, "max_connections": 77,
    }  # fmt: skip
    assert (
        load(overrides=overrides_from(build_parser().parse_args(["--workers", "auto"]))).workers
        == "auto"
    )
    assert overrides_from(build_parser().parse_args([])) == {}  # absent flags change nothing


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"prot": 1}, "prot"),
        ({"port": 70000}, "port"),
        ({"pools": {"mask": {"endpoints": ["ftp://x"]}}}, "pools.mask.endpoints.0"),
        ({"pools": {"mask": {"endpoints": ["http://x/v1"]}}}, "pools.mask.endpoints.0"),
        ({"pools": {"general": {"max_concurency": 3}}}, "pools.general.max_concurency"),
        ({"pools": {"other": {}}}, "pools.other"),
        ({"timeouts": {"idle_s": 0}}, "timeouts.idle_s"),
        ({"policy": {"max_mask_tokens": "many"}}, "policy.max_mask_tokens"),
        ({"workers": 2, "port": 0}, "workers > 1 needs a fixed port"),
        ({"workers": "many"}, "workers"),
        ({"workers": 0}, "workers"),
        ({"clients": {"header_timeout_s": 0}}, "clients.header_timeout_s"),
        ({"clients": {"max_connections": 0}}, "clients.max_connections"),
        ({"api_keys": ["a"], "mask_allow_keys": ["b"]}, "subset of api_keys"),
        ({"mask_allow_keys": ["b"]}, "needs api_keys"),
    ],
)
def test_bad_values_name_the_field(data, field):
    with pytest.raises(ConfigError) as info:
        load(overrides=data)
    assert field in str(info.value)


def test_cli_exits_2_with_the_field_named(capsys, monkeypatch, tmp_path):
    for name in [n for n in __import__("os").environ if n.startswith("MASKGATE_")]:
        monkeypatch.delenv(name)
    assert main(["--port", "-5"]) == 2
    assert "port" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  mask:\n    endpionts: []\n")
    assert main(["--config", str(bad)]) == 2
    assert "pools.mask.endpionts" in capsys.readouterr().err
    monkeypatch.setenv("MASKGATE_TIMEOUTS__CONNECT_S", "-1")
    assert main([]) == 2
    assert "timeouts.connect_s" in capsys.readouterr().err


def test_check_config_prints_the_merged_config(capsys, monkeypatch):
    monkeypatch.setenv("MASKGATE_ADMIN_KEY", "adm")
    monkeypatch.setenv("MASKGATE_WORKER_MODEL", "tiny")  # the worker's, not a gateway field
    assert main(["--check-config", "--mask-endpoint", "http://m:30000"]) == 0
    out = capsys.readouterr().out
    assert "http://m:30000" in out
    # Keys never reach the terminal: they are replaced by a marker.
    assert '"admin_key": "<redacted>"' in out and '"adm"' not in out


def test_access_flags_and_the_start_refusal(capsys, monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("MASKGATE_")]:
        monkeypatch.delenv(name)
    argv = ["--check-config", "--trusted-network", "10.0.0.0/8", "--insecure-control"]
    argv += ["--upstream-admin-api-key", "wadm"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert '"trusted_networks": [\n    "10.0.0.0/8"\n  ]' in out
    assert '"insecure_control": true' in out
    assert '"upstream_admin_api_key": "<redacted>"' in out and "wadm" not in out
    # Control asked for on 0.0.0.0 with nothing to secure it: the start fails, saying why.
    monkeypatch.setenv("MASKGATE_CONTROL__ENABLED", "true")
    assert main(["--check-config"]) == 2
    err = capsys.readouterr().err
    assert "admin_key" in err and "trusted_networks" in err and "insecure_control" in err
    assert main(["--check-config", "--admin-key", "adm"]) == 0

"""`maskgate gateway ...` (and `python -m maskgate.gateway ...`).

Flags are only the last layer of the one configuration path: they become an overrides dict
for `load_settings` (YAML file < MASKGATE_* environment < flags), so a flag and the config
key it sets always mean the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from maskgate.gateway.config import GatewayConfig
from maskgate.gateway.processes.cores import process_count
from maskgate.protocol.policy_settings import MAX_MASK_TOKENS
from maskgate.protocol.settings import ConfigError, load_settings

# The worker reads MASKGATE_WORKER_*; one environment may hold both configurations.
WORKER_ENV_PREFIXES = ("MASKGATE_WORKER_",)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maskgate gateway",
        description="Reverse proxy that routes sampling-mask requests to a dedicated pool.",
        argument_default=argparse.SUPPRESS,  # an absent flag leaves the config value alone
    )
    p.add_argument("--config", metavar="FILE", help="YAML config file")
    p.add_argument("--host", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="listen port (default 8080)")
    p.add_argument("--metrics-port", type=int, help="serve /metrics on this port instead")
    p.add_argument(
        "--workers",
        type=_workers,
        help="processes sharing the port (SO_REUSEPORT); `auto` (default): one per CPU",
    )
    p.add_argument("--client-header-timeout", type=float, metavar="S", help="request head (10)")
    p.add_argument("--client-body-timeout", type=float, metavar="S", help="body silence (30)")
    p.add_argument("--client-body-deadline", type=float, metavar="S", help="whole body (120)")
    p.add_argument("--client-idle-timeout", type=float, metavar="S", help="keep-alive idle (75)")
    p.add_argument("--max-client-connections", type=int, metavar="N", help="open (10000)")
    p.add_argument(
        "--general-endpoint",
        action="append",
        metavar="URL",
        help="general pool upstream (repeatable)",
    )
    p.add_argument(
        "--mask-endpoint", action="append", metavar="URL", help="mask pool upstream (repeatable)"
    )
    p.add_argument("--general-dns", metavar="NAME", help="discover general upstreams by DNS")
    p.add_argument("--mask-dns", metavar="NAME", help="discover mask upstreams by DNS")
    p.add_argument(
        "--max-mask-tokens", type=int, metavar="N", help=f"mask cap (default {MAX_MASK_TOKENS})"
    )
    p.add_argument("--api-key", action="append", metavar="KEY", help="client key (repeatable)")
    p.add_argument(
        "--mask-allow-key", action="append", metavar="KEY", help="key allowed masks (repeatable)"
    )
    p.add_argument("--admin-key", metavar="KEY", help="key for the /admin API")
    p.add_argument(
        "--admin-port", type=int, metavar="PORT", help="keyless admin API on 127.0.0.1:PORT"
    )
    p.add_argument(
        "--trusted-proxy",
        action="append",
        metavar="CIDR",
        help="peer whose X-Forwarded-For is kept and extended (repeatable)",
    )
    p.add_argument(
        "--trusted-network",
        action="append",
        metavar="CIDR",
        help="callers that reach control and registration without the admin key "
        "(repeatable; default loopback)",
    )
    p.add_argument(
        "--insecure-control",
        action="store_true",
        help="serve control and registration to anyone, with no key (logged as insecure)",
    )
    p.add_argument("--upstream-api-key", metavar="KEY", help="credential sent upstream")
    p.add_argument(
        "--upstream-admin-api-key",
        metavar="KEY",
        help="credential sent on control calls to workers (default: --upstream-api-key)",
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--no-access-log", action="store_true", help="no per-request log line")
    p.add_argument(
        "--check-config", action="store_true", help="validate, print the config as JSON, exit"
    )
    return p


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'auto'") from None


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """Turn the given flags into the nested dict `load_settings` merges last."""
    a = vars(args)
    out: dict[str, Any] = {}
    simple = {
        "host": "host",
        "port": "port",
        "metrics_port": "metrics_port",
        "workers": "workers",
        "api_key": "api_keys",
        "mask_allow_key": "mask_allow_keys",
        "admin_key": "admin_key",
        "admin_port": "admin_port",
        "trusted_proxy": "trusted_proxies",
        "trusted_network": "trusted_networks",
        "upstream_api_key": "upstream_api_key",
        "upstream_admin_api_key": "upstream_admin_api_key",
        "log_level": "log_level",
    }
    for flag, key in simple.items():
        if flag in a:
            out[key] = a[flag]
    if a.get("no_access_log"):
        out["access_log"] = False
    if a.get("insecure_control"):
        out["insecure_control"] = True
    clients = {
        key: a[flag]
        for flag, key in (
            ("client_header_timeout", "header_timeout_s"),
            ("client_body_timeout", "body_timeout_s"),
            ("client_body_deadline", "body_deadline_s"),
            ("client_idle_timeout", "idle_timeout_s"),
            ("max_client_connections", "max_connections"),
        )
        if flag in a
    }
    if clients:
        out["clients"] = clients
    if "max_mask_tokens" in a:
        out["policy"] = {"max_mask_tokens": a["max_mask_tokens"]}
    pools: dict[str, dict[str, Any]] = {}
    for name in ("general", "mask"):
        if f"{name}_endpoint" in a:
            pools.setdefault(name, {})["endpoints"] = a[f"{name}_endpoint"]
        if f"{name}_dns" in a:
            pools.setdefault(name, {})["dns"] = a[f"{name}_dns"]
    if pools:
        out["pools"] = pools
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_settings(
            GatewayConfig,
            file=getattr(args, "config", None),
            env=os.environ,
            env_ignore=WORKER_ENV_PREFIXES,
            overrides=overrides_from(args),
        )
    except ConfigError as e:
        print(f"maskgate gateway: {e}", file=sys.stderr)
        return 2
    if getattr(args, "check_config", False):
        print(redacted_json(config))
        return 0

    from maskgate.gateway.observability.logs import configure_logging

    configure_logging(config.log_level, config.access_log)
    processes = process_count(config)
    if processes > 1:
        from maskgate.gateway.processes.supervisor import run_workers

        return run_workers(config, processes)
    from maskgate.gateway.processes.serve import run

    run(config)
    return 0


_SECRET_FIELDS = (
    "api_keys",
    "mask_allow_keys",
    "admin_key",
    "upstream_api_key",
    "upstream_admin_api_key",
)


def redacted_json(config: GatewayConfig) -> str:
    """The merged config for `--check-config`, with every key replaced by a marker: the
    output lands in terminals and CI logs."""
    data = config.model_dump(mode="json")
    for name in _SECRET_FIELDS:
        value = data.get(name)
        if isinstance(value, list):
            data[name] = ["<redacted>"] * len(value)
        elif value is not None:
            data[name] = "<redacted>"
    return json.dumps(data, indent=2)

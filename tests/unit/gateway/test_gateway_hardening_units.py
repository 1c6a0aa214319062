"""The pure pieces behind the gateway's hardening: body decoding,
hop-by-hop and client-address headers, unsafe endpoint addresses, and their settings."""

from __future__ import annotations

import gzip
import ipaddress
import zlib

import pytest

from maskgate.gateway.clients.access import is_trusted
from maskgate.gateway.config import GatewayConfig
from maskgate.gateway.proxy.encoding import codings, decode_body
from maskgate.gateway.proxy.headers import connection_listed
from maskgate.gateway.rl.admin_urls import unsafe_address
from maskgate.protocol.errors import ApiError
from maskgate.protocol.settings import ConfigError, load_settings


def test_decode_body():
    assert codings(["gzip", " Identity , deflate"]) == ["gzip", "deflate"]
    assert decode_body(gzip.compress(zlib.compress(b"x")), ["deflate", "gzip"], 10) == b"x"
    with pytest.raises(ApiError) as info:
        decode_body(gzip.compress(b"x" * 11), ["gzip"], 10)
    assert (info.value.status, info.value.code) == (413, "body_too_large")
    decode_body(gzip.compress(b"x" * 10), ["gzip"], 10)  # exactly the limit
    with pytest.raises(ApiError) as info:
        decode_body(b"", ["compress"], 10)
    assert (info.value.status, info.value.code) == (415, "unsupported_content_encoding")


def test_connection_listed():
    assert connection_listed(["close", "X-A, x-b", " keep-alive ,,X-C"]) == {"x-a", "x-b", "x-c"}


def test_is_trusted():
    nets = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")]
    assert is_trusted("10.1.2.3", nets) and is_trusted("::ffff:10.0.0.1", nets)
    assert is_trusted("fd00::1", nets)
    assert not is_trusted("11.0.0.1", nets) and not is_trusted(None, nets)
    assert not is_trusted("10.0.0.1", []) and not is_trusted("junk", nets)


@pytest.mark.parametrize(
    ("address", "unsafe"),
    [
        ("169.254.169.254", True),
        ("169.254.1.1", True),
        ("fe80::1%eth0", True),
        ("::ffff:169.254.169.254", True),
        ("100.100.100.200", True),
        ("fd00:ec2::254", True),
        ("10.0.0.1", False),
        ("127.0.0.1", False),
        ("rollout-0.svc", False),  # names are resolved by the caller
    ],
)
def test_unsafe_address(address, unsafe):
    assert (unsafe_address(address) is not None) is unsafe


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"admin_host": "0.0.0.0"}, "admin_host must be a loopback address"),
        ({"admin_host": "example.com"}, "admin_host must be a loopback address"),
        ({"admin_port": 8080}, "admin_port must differ"),
        ({"trusted_proxies": ["10.0.0.0/33"]}, "not an IP address or CIDR network"),
        ({"admin_key": ""}, "admin_key must not be empty"),
        ({"policy": {"max_batch_items": 0}}, "max_batch_items"),
        ({"offload": {"workers": 0}}, "offload.workers"),
    ],
)
def test_settings_are_validated(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(GatewayConfig, overrides=overrides)


def test_settings_defaults():
    cfg = load_settings(GatewayConfig, env={"MASKGATE_TRUSTED_PROXIES": "[10.0.0.0/8]"})
    assert cfg.trusted_proxies == ["10.0.0.0/8"]
    assert (cfg.admin_key, cfg.admin_port, cfg.admin_allow_unsafe_urls) == (None, None, False)
    assert cfg.policy.to_policy().max_batch_items == 4096
    assert (cfg.offload.min_bytes, cfg.offload.min_items) == (1 << 20, 256)

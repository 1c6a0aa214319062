"""The OpenAPI document the fuzz tests hold the gateway to is itself well formed: every
schema is valid JSON Schema 2020-12, every $ref resolves, every operation documents its
answers, and the error code enum covers the whole mask policy."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest

from maskgate.gateway import GatewayConfig
from maskgate.gateway.openapi import ERROR_CODES, openapi_spec, request_schema
from maskgate.gateway.routes import main_table
from maskgate.protocol.policy import POLICY_CODES
from maskgate.protocol.settings import load_settings

pytestmark = pytest.mark.integration

METHODS = ("get", "post", "put", "delete", "patch")


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _every_part_on() -> GatewayConfig:
    """A gateway with every row served: control, registration, the admin API, /metrics."""
    return load_settings(GatewayConfig, overrides={"host": "127.0.0.1", "admin_key": "adm"})


def test_openapi_document_is_well_formed() -> None:
    spec = openapi_spec(main_table(_every_part_on()))
    assert spec["openapi"].startswith("3.1")
    orjson.dumps(spec)  # serialisable as served
    for schema in spec["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    for ref in _refs(spec):
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[1] in spec["components"]["schemas"], ref
    for path, item in spec["paths"].items():
        ops = [m for m in METHODS if m in item]
        assert ops, path
        for m in ops:
            assert item[m]["responses"], (path, m)
    assert set(POLICY_CODES) <= set(ERROR_CODES)
    assert "mask_pool_unavailable" in ERROR_CODES
    assert len(set(ERROR_CODES)) == len(ERROR_CODES)
    codes = spec["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
    assert codes["enum"] == list(ERROR_CODES)
    # Callers get their own copy.
    spec["paths"].clear()
    assert openapi_spec(main_table(_every_part_on()))["paths"]


@pytest.mark.parametrize(
    ("path", "body", "valid"),
    [
        (
            "/v1/chat/completions",
            {"messages": [], "return_sampling_mask": True, "return_meta_info": True, "top_k": 20},
            True,
        ),
        (
            "/v1/chat/completions",
            {"messages": [], "return_sampling_mask": True, "return_meta_info": True, "top_k": "20"},
            False,
        ),
        (
            "/v1/chat/completions",
            {"messages": [], "return_sampling_mask": True, "top_k": 20},
            False,
        ),  # rule 4
        (
            "/v1/completions",
            {
                "prompt": "x",
                "return_sampling_mask": True,
                "return_meta_info": True,
                "top_p": 0.9,
                "stream": True,
            },
            False,
        ),
        (
            "/v1/completions",
            {
                "prompt": "x",
                "return_sampling_mask": True,
                "return_meta_info": True,
                "top_p": 0.9,
                "presence_penalty": 0.5,
            },
            False,
        ),  # rule 6
        ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5, "stream": True}, True),
        (
            "/generate",
            {
                "text": "x",
                "return_sampling_mask": True,
                "stream": True,
                "sampling_params": {"min_p": 0.1},
            },
            True,
        ),
        (
            "/generate",
            {"text": "x", "return_sampling_mask": True, "sampling_params": {"temperature": True}},
            False,
        ),
        ("/generate", {"text": "x", "return_sampling_mask": [True]}, False),  # single
        (
            "/generate",
            {
                "text": ["x", "y"],
                "return_sampling_mask": [True, False],
                "sampling_params": [{"top_k": 5}, {}],
            },
            True,
        ),
    ],
)
def test_request_schemas_follow_the_policy_rules_they_express(
    path: str, body: dict[str, Any], valid: bool
) -> None:
    validator = jsonschema.Draft202012Validator(request_schema(path))
    assert validator.is_valid(body) is valid, list(validator.iter_errors(body))


async def test_gateway_serves_its_openapi_description(upstreams, gateway, make_config):
    general = await upstreams()
    config = make_config([general.url], [])
    async with (
        gateway(config) as gw,
        gw.client.get(gw.url + "/openapi.json") as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        served = await resp.json()
    assert served == openapi_spec(main_table(config))
    assert {"/v1/chat/completions", "/v1/completions", "/generate"} <= set(served["paths"])
    assert general.requests == []  # answered by the gateway itself, never proxied

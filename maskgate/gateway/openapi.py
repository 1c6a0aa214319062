"""The OpenAPI 3.1 description of the gateway's HTTP surface, served as `GET /openapi.json`.

Request schemas describe what the gateway accepts, with the mask fields and sampling fields
typed and bounded exactly as the mask policy checks them (docs/design.md, Policy, rule 3: `true`
is not a number, `"20"` is not an integer). Rules that relate several fields (meta info,
streaming, logit transforms) are written as `if`/`then` on `return_sampling_mask`; the
rules that need arithmetic (full vocabulary, the top-k cap, the payload estimate) are given
in prose under `x-maskgate-mask-policy`. Unknown fields are allowed everywhere: the gateway
forwards them untouched.

JSON Schema counts `1.0` as an integer; the gateway does not (it must be written `1`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from maskgate.gateway.api.control_paths import CONTROL_CODES
from maskgate.gateway.api.paths import DOCUMENTED, ENDPOINT_LIST, INVOCATIONS, error_ref
from maskgate.protocol.bounds import BOUNDS
from maskgate.protocol.errors import GATEWAY_CODES
from maskgate.protocol.policy import POLICY_CODES
from maskgate.protocol.transforms import GRAMMAR_FIELDS

if TYPE_CHECKING:
    from maskgate.gateway.routes import Row

_VARIABLE = re.compile(r"\{(\w+):[^}]*\}")
ERROR_CODES = tuple(dict.fromkeys((*sorted(POLICY_CODES), *GATEWAY_CODES, *CONTROL_CODES)))

_MASK_POLICY = [
    "1. The body is a JSON object within the size limit (400 invalid_json, 413 body_too_large).",
    "2. With an allow-list configured, only listed keys may ask for masks "
    "(403 sampling_mask_forbidden).",
    "3. Mask and sampling fields have the types and ranges of this schema "
    "(400 sampling_mask_invalid_param).",
    "4. Chat and completions: return_meta_info=true (400 sampling_mask_requires_meta_info).",
    "5. Chat and completions: not stream=true (400 sampling_mask_stream_unsupported).",
    "6. No penalties, logit_bias, grammar constraints, min_tokens, custom logit processors, "
    "LoRA adapters (lora_path, lora_id, lora_name, model 'base:adapter'), or tools / "
    "functions unless tool_choice is 'none' (400 sampling_mask_logit_transform).",
    "7. Not the full vocabulary: with defaults resolved and every value read in float32, a "
    "sampling request (temperature >= 1e-6) with top_k off (-1, 0 or >= vocab size), "
    "top_p >= 1 and min_p == 0 is rejected (400 sampling_mask_full_vocabulary).",
    "8. top_k <= max_mask_tokens (400 sampling_mask_top_k_exceeds_cap).",
    "9. At most max_batch_items prompts (413 sampling_mask_batch_too_large), and "
    "prompts * n * max(max_tokens, 1) * (min(top_k or cap, cap) + log-prob width) + prompt "
    "log-prob rows * width <= max_mask_ids_per_request "
    "(400 sampling_mask_payload_too_large).",
    "10. Mask pool admission (429 pool_overloaded / 503 queue_timeout, with Retry-After).",
]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _per_item(schema: dict[str, Any]) -> dict[str, Any]:
    """A /generate field given once, or once per batch item (null entries allowed)."""
    return _nullable({"anyOf": [schema, {"type": "array", "items": _nullable(schema)}]})


def _bounded(name: str) -> dict[str, Any]:
    """A numeric field with the policy's own range (protocol/bounds.py), or null."""
    return _nullable(BOUNDS[name].schema())


_STOP = _nullable({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})

_ANY: dict[str, Any] = {}  # any JSON value
_EMPTY = {"anyOf": [{"type": "null"}, {"const": ""}, {"const": []}, {"const": {}}]}
# Grammar constraints (rule 6, `policy.GRAMMAR_FIELDS`): passed through untyped; under a
# mask they must be empty.

# Sampling fields shared by the OpenAI bodies (top level) and SGLang's `sampling_params`.
SAMPLING_FIELDS: dict[str, Any] = {
    "temperature": _bounded("temperature"),
    "top_p": _bounded("top_p"),
    "top_k": _nullable({**BOUNDS["top_k"].schema(), "description": "-1 and 0 mean off"}),
    "min_p": _bounded("min_p"),
    "frequency_penalty": _nullable({"type": "number"}),
    "presence_penalty": _nullable({"type": "number"}),
    "repetition_penalty": _nullable({"type": "number"}),
    "min_tokens": _bounded("min_tokens"),
    "min_new_tokens": _bounded("min_new_tokens"),
    "n": _bounded("n"),
    "stop": _STOP,
    "logit_bias": _ANY,
    "custom_logit_processor": _ANY,
    **dict.fromkeys(GRAMMAR_FIELDS, _ANY),
}
_MASK_MODE = _nullable({"type": "string", "enum": ["exact", "bounded"]})
_MASK_FORMAT_ONE = {"type": "string", "enum": ["lists", "packed"]}
_MASK_FORMAT = _nullable(_MASK_FORMAT_ONE)

# Under a mask: every logit transform neutral or absent (rule 6).
_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": _nullable({"const": 0}),
    "presence_penalty": _nullable({"const": 0}),
    "repetition_penalty": _nullable({"const": 1}),
    "min_tokens": _nullable({"const": 0}),
    "min_new_tokens": _nullable({"const": 0}),
    "logit_bias": {"anyOf": [{"type": "null"}, {"const": []}, {"const": {}}]},
    "custom_logit_processor": {"anyOf": [{"type": "null"}, {"const": ""}]},
    **dict.fromkeys(GRAMMAR_FIELDS, _EMPTY),
}
_ASKS_MASK = {
    "properties": {"return_sampling_mask": {"const": True}},
    "required": ["return_sampling_mask"],
}


def _openai_request(extra: dict[str, Any], required: list[str]) -> dict[str, Any]:
    props = {
        "model": {"type": "string"},
        **extra,
        **SAMPLING_FIELDS,
        "max_tokens": _bounded("max_tokens"),
        "best_of": _bounded("best_of"),
        "stream": _nullable({"type": "boolean"}),
        "seed": _nullable({"type": "integer"}),
        "response_format": _nullable({"type": "object"}),
        "return_sampling_mask": _nullable({"type": "boolean"}),
        "return_meta_info": _nullable({"type": "boolean"}),
        "return_token_ids": _nullable({"type": "boolean"}),
        "sampling_mask_mode": _MASK_MODE,
        "sampling_mask_format": _MASK_FORMAT,
        "sampling_seed": _nullable({"type": "integer"}),
    }
    mask_rules = {
        "properties": {
            "return_meta_info": {"const": True},
            "stream": {"enum": [False, None]},
            "response_format": _nullable(
                {"type": "object", "properties": {"type": _nullable({"const": "text"})}}
            ),
            **_NEUTRAL,
        },
        "required": ["return_meta_info"],
    }
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": True,
        "if": _ASKS_MASK,
        "then": mask_rules,
    }


CHAT_REQUEST = _openai_request(
    {
        "messages": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"role": {"type": "string"}, "content": {}},
                "required": ["role"],
            },
        },
        "max_completion_tokens": _bounded("max_completion_tokens"),
        "logprobs": _nullable({"type": "boolean"}),
        "top_logprobs": _bounded("top_logprobs"),
    },
    ["messages"],
)
COMPLETION_REQUEST = _openai_request(
    {
        "prompt": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            ]
        },
        "logprobs": _nullable({"type": "integer", "minimum": 0}),  # the top count
        "echo": _nullable({"type": "boolean"}),
    },
    ["prompt"],
)

SAMPLING_PARAMS = {
    "type": "object",
    "properties": {**SAMPLING_FIELDS, "max_new_tokens": _bounded("max_new_tokens")},
    "additionalProperties": True,
}
_MASKED_SAMPLING_PARAMS = {"type": "object", "properties": _NEUTRAL}
# SGLang's batch test: `text` is a list, or `input_ids` is a list of lists.
_BATCH = {
    "anyOf": [
        {"properties": {"text": {"type": "array"}}, "required": ["text"]},
        {
            "properties": {"input_ids": {"type": "array", "prefixItems": [{"type": "array"}]}},
            "required": ["input_ids"],
        },
    ]
}
GENERATE_REQUEST = {
    "type": "object",
    "description": "SGLang's native request: one prompt, or a batch when `text` is a list of "
    "strings or `input_ids` a list of lists. In a batch, `return_sampling_mask` and "
    "`sampling_params` may be lists, one entry per prompt (the lengths must match; the "
    "gateway checks it). A batch is a mask request when any item asks for a mask; the whole "
    "batch then goes to the mask pool, and rules 6-9 apply to the items that ask.",
    "properties": {
        "text": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "input_ids": {
            "anyOf": [
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            ]
        },
        "sampling_params": _nullable(
            {"anyOf": [SAMPLING_PARAMS, {"type": "array", "items": SAMPLING_PARAMS}]}
        ),
        "return_sampling_mask": _nullable(
            {"anyOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "boolean"}}]}
        ),
        "sampling_mask_mode": _MASK_MODE,
        "sampling_mask_format": _nullable(
            {"anyOf": [_MASK_FORMAT_ONE, {"type": "array", "items": _MASK_FORMAT_ONE}]}
        ),
        "stream": _nullable({"type": "boolean"}),
        "rid": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "return_logprob": _per_item({"type": "boolean"}),
        "top_logprobs_num": _per_item(BOUNDS["top_logprobs_num"].schema()),
        "logprob_start_len": _per_item(BOUNDS["logprob_start_len"].schema()),
        "token_ids_logprob": _per_item({"type": "array", "items": {"type": "integer"}}),
        "custom_logit_processor": _ANY,
    },
    "additionalProperties": True,
    "allOf": [
        {  # a single prompt takes one flag and one sampling_params object
            "if": _BATCH,
            "else": {
                "properties": {
                    "return_sampling_mask": _nullable({"type": "boolean"}),
                    "sampling_params": _nullable(SAMPLING_PARAMS),
                }
            },
        },
        {
            "if": _ASKS_MASK,
            "then": {
                "properties": {
                    "sampling_params": _nullable(
                        {
                            "anyOf": [
                                _MASKED_SAMPLING_PARAMS,
                                {"type": "array", "items": _MASKED_SAMPLING_PARAMS},
                            ]
                        }
                    ),
                    "custom_logit_processor": {"anyOf": [{"type": "null"}, {"const": ""}]},
                }
            },
        },
    ],
}

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "enum": ["invalid_request_error", "server_error"]},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string", "enum": list(ERROR_CODES)},
            },
        }
    },
}

_MASK_META = {
    "type": "object",
    "description": "One mask (token ids, argmax first) and one log-prob "
    "per generated token; the sampled token is always inside its mask. Packed: base64 "
    "little-endian int32 ids (ascending per token) and T + 1 offsets instead.",
    "properties": {
        "output_token_sampling_mask": {
            "type": "array",
            "items": {"type": "array", "items": {"type": "integer"}},
        },
        "output_token_sampling_mask_ids": {"type": "string", "contentEncoding": "base64"},
        "output_token_sampling_mask_offsets": {"type": "string", "contentEncoding": "base64"},
        "output_token_sampling_logprobs": {"type": "array", "items": {"type": "number"}},
        "output_token_sampling_mask_length": {"type": "integer"},
        "output_token_sampling_mask_truncated": {"type": "array", "items": {"type": "boolean"}},
    },
    "additionalProperties": True,
}


_SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "maskgate gateway",
        "version": "0.1.0",
        "description": "An OpenAI-compatible reverse proxy that routes sampling-mask requests "
        "to a dedicated mask pool and enforces the mask policy. It serves exactly the paths "
        "listed here (its route table); any other path answers 404 not_found. Each operation's "
        "`x-maskgate-access` says who may call it: public, client (a client key when api_keys "
        "are set), control (the admin key or a caller in trusted_networks), admin (the admin "
        "key).",
    },
    "x-maskgate-mask-policy": _MASK_POLICY,
    "components": {
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "Client API key, when `api_keys` is configured; the admin "
                "API takes the admin key when `admin_key` is configured.",
            }
        },
        "schemas": {
            "ChatCompletionRequest": CHAT_REQUEST,
            "CompletionRequest": COMPLETION_REQUEST,
            "GenerateRequest": GENERATE_REQUEST,
            "SamplingParams": SAMPLING_PARAMS,
            "MaskMetaInfo": _MASK_META,
            "Error": ERROR,
            "EndpointList": ENDPOINT_LIST,
        },
    },
    "security": [{}, {"bearer": []}],  # authentication is optional (configuration)
}


def openapi_spec(rows: Sequence[Row]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of an app's route table `rows` (routes.py), as a fresh dict:
    one operation per row and method, its access level in `x-maskgate-access`."""
    spec = copy.deepcopy(_SPEC)
    paths: dict[str, Any] = {}
    for row in rows:
        if not row.documented:
            continue
        path = _VARIABLE.sub(r"{\1}", row.path)  # aiohttp's {name:regex} -> {name}
        known = DOCUMENTED.get(row.upstream if row.upstream else path, {})
        item = paths.setdefault(path, {k: v for k, v in known.items() if k == "parameters"})
        for method in row.methods:
            op = known.get(method.lower()) or known.get("post") or known.get("get")
            op = copy.deepcopy(op) if op else _generic(row, method)
            if path == "/invocations":
                op["summary"] = INVOCATIONS
            op["x-maskgate-access"] = row.access.value
            item[method.lower()] = op
    spec["paths"] = paths
    return spec


def _generic(row: Row, method: str) -> dict[str, Any]:
    what = f"proxied to {row.upstream}" if row.upstream else "answered by the gateway"
    return {
        "summary": f"{method} {row.path}: {what}",
        "responses": {"200": {"description": "The answer"}, "default": error_ref()},
    }


def request_schema(path: str) -> dict[str, Any]:
    """The JSON Schema (2020-12) of the request body of `path`, e.g. "/generate"."""
    name = {
        "/v1/chat/completions": "ChatCompletionRequest",
        "/v1/completions": "CompletionRequest",
        "/generate": "GenerateRequest",
    }[path]
    return copy.deepcopy(_SPEC["components"]["schemas"][name])

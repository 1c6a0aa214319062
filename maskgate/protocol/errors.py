"""Typed errors and the one renderer that turns them into OpenAI-style error bodies.

Every answer the gateway (or a worker) gives for a bad request is an `ApiError`; handlers raise,
one middleware renders. The body shape is OpenAI's:
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any

import orjson

INVALID_REQUEST = "invalid_request_error"

# Codes the gateway answers outside the mask policy (authentication, routing, upstreams,
# the admin API, the HTTP layer).
GATEWAY_CODES = (  # the policy's own are policy.POLICY_CODES
    "missing_api_key",
    "invalid_api_key",
    "invalid_admin_key",
    "mask_pool_unavailable",
    "no_healthy_upstream",
    "upstream_unreachable",
    "upstream_timeout",
    "upstream_error",
    "upstream_protocol_error",
    "upstream_stream_error",
    "upstream_answer_too_large",
    "upstream_invalid_mask",
    "upstream_invalid_request",
    "unknown_pool",
    "unknown_endpoint",
    "invalid_endpoint",
    "not_found",
    "method_not_allowed",
    "unsupported_content_encoding",
    "invalid_content_encoding",
    "invalid_body",
    "admin_api_disabled",
    "unsafe_endpoint",
    "http_error",
    "request_timeout",
    "too_many_connections",
    "internal_error",
    "unsafe_upstream_request",
    "control_forbidden",
)


class ApiError(Exception):
    """An error answer: HTTP status, a stable machine-readable code and a human message."""

    status: int = 400
    error_type: str = INVALID_REQUEST

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        if status is not None:
            self.status = status
        if error_type is not None:
            self.error_type = error_type
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole (the gateway checks large bodies in worker processes): the default
        # would rebuild from `args` alone and lose the code, status and headers.
        state = (self.code, self.message, self.status, self.param, self.error_type, self.headers)
        return (_rebuild, (type(self), *state))


class PolicyError(ApiError):
    """A mask-policy rejection (docs/design.md, Policy, rules 1-9). Nothing is sent upstream."""


class ServerError(ApiError):
    """A failure on our side or upstream (5xx)."""

    status = 502
    error_type = "server_error"


def _rebuild(
    cls: type[ApiError],
    code: str,
    message: str,
    status: int,
    param: str | None,
    error_type: str,
    headers: dict[str, str],
) -> ApiError:
    return cls(code, message, status=status, param=param, error_type=error_type, headers=headers)


class VersionUnavailable(ApiError):
    """409 `weight_version_unavailable`: no serving endpoint has the weights a request asked
    for with `min_weight_version` (the RL control plane, docs/rl.md)."""

    status = 409

    def __init__(self, wanted: str, pool: str) -> None:
        super().__init__(
            "weight_version_unavailable",
            f"no endpoint of the {pool} pool serves weight version {wanted!r} or newer; "
            "retry after the weight sync",
            param="min_weight_version",
        )


def error_event(err: ApiError) -> bytes:
    """The SSE frame that ends a stream the gateway cannot finish (mid-stream upstream failure)."""
    return b"data: " + err.to_bytes() + b"\n\n"

"""Typed errors and the one renderer that turns them into OpenAI-style error bodies.

Every answer the gateway (or a worker) gives for a bad request is an `ApiError`; handlers raise,
one middleware renders. The body shape is OpenAI's:
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any

import orjson

INVALID_REQUEST = "invalid_request_error"


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


class PolicyError(ApiError):
    """A mask-policy rejection (docs/design.md, Policy, rules 1-9). Nothing is sent upstream."""


class ServerError(ApiError):
    """A failure on our side or upstream (5xx)."""

    status = 502
    error_type = "server_error"


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

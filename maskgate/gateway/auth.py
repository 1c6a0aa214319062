"""Client authentication (Bearer API keys) and the mask allow-list (rule 2)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from maskgate.protocol.errors import ApiError, PolicyError

_BEARER = "bearer "


def bearer_token(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization")
    if value is None or value[:7].lower() != _BEARER:
        return None
    return value[7:].strip() or None


def authenticate(headers: Mapping[str, str], keys: frozenset[str]) -> str | None:
    """The caller's key; None when authentication is off. Raises 401 otherwise."""
    if not keys:
        return None
    token = bearer_token(headers)
    if token is None:
        raise ApiError(
            "missing_api_key",
            "this gateway needs an API key: send 'Authorization: Bearer <key>'",
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    if token not in keys:
        raise ApiError(
            "invalid_api_key",
            "the API key is not valid",
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token


def check_mask_allowed(key: str | None, allow: frozenset[str] | None) -> None:
    """Rule 2: when an allow-list is configured, only its keys may ask for masks."""
    if allow is not None and key not in allow:
        raise PolicyError(
            "sampling_mask_forbidden",
            "this API key may not request sampling masks (return_sampling_mask)",
            status=403,
            param="return_sampling_mask",
        )


def check_admin(headers: Mapping[str, str], admin_key: str | None) -> None:
    """The admin API takes the admin key when one is set. Without one it is served only on the
    loopback-only `admin_port` listener (app.py), which needs no key."""
    if admin_key is None:
        return
    token = bearer_token(headers) or headers.get("X-Admin-Key")
    if token is None or not hmac.compare_digest(token.encode(), admin_key.encode()):
        raise ApiError(
            "invalid_admin_key",
            "the admin API needs the admin key: send 'Authorization: Bearer <admin key>'",
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

"""Keys on the worker's routes, with SGLang's `--api-key` / `--admin-api-key` semantics.

Every route of the table (routes.py) has one access level:

- `public`: health, readiness and metrics, always open (probes and scrapers hold no key);
- `normal`: inference and read-only facts. With an api key set, only that key passes (the
  admin key does not); without one, open;
- `admin_optional`: control (weights, pause/continue, abort, flush, memory). The admin key
  when one is set (the api key then does not pass), else the api key when one is set, else
  open.

A key arrives as `Authorization: Bearer <key>` or, as SGLang also accepts, `x-api-key: <key>`.
Keys are compared in constant time; a refusal is 401 and never echoes what was sent.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import SecretStr

from maskgate.protocol.errors import ApiError


class Access(StrEnum):
    PUBLIC = "public"
    NORMAL = "normal"
    ADMIN_OPTIONAL = "admin_optional"


@dataclass(frozen=True, slots=True)
class Keys:
    api_key: bytes | None = None
    admin_api_key: bytes | None = None

    @classmethod
    def of(cls, api_key: SecretStr | None, admin_api_key: SecretStr | None) -> Keys:
        def raw(key: SecretStr | None) -> bytes | None:
            return key.get_secret_value().encode() if key is not None else None

        return cls(raw(api_key), raw(admin_api_key))


def check_access(access: Access, headers: Mapping[str, str], keys: Keys) -> None:
    """Raises 401 unless `headers` carry what `access` needs under `keys`."""
    if access is Access.PUBLIC:
        return
    if access is Access.ADMIN_OPTIONAL and keys.admin_api_key is not None:
        if not _presents(headers, keys.admin_api_key):
            raise _refused("invalid_admin_key", "this control route needs the admin API key")
        return
    if keys.api_key is not None and not _presents(headers, keys.api_key):
        raise _refused("invalid_api_key", "this route needs the API key")


def _presents(headers: Mapping[str, str], expected: bytes) -> bool:
    """Either header matching is enough (as SGLang); both are always compared, so the time
    taken does not tell which one was tried."""
    bearer = _bearer(headers.get("Authorization"))
    other = headers.get("x-api-key")
    by_bearer = bearer is not None and hmac.compare_digest(_raw(bearer), expected)
    by_header = other is not None and hmac.compare_digest(_raw(other), expected)
    return by_bearer or by_header


def _raw(header: str) -> bytes:
    return header.encode("utf-8", "surrogatepass")  # any header string, never an error


def _bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def _refused(code: str, message: str) -> ApiError:
    return ApiError(
        code,
        f"{message}: send 'Authorization: Bearer <key>'",
        status=401,
        headers={"WWW-Authenticate": "Bearer"},
    )

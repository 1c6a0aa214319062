"""The one place that writes an upstream request head (client.py sends what this returns).

Whatever a client sent and the gateway passes on (a query, a header) is checked here, once,
for every request the gateway makes: the proxied traffic, each control fan-out, the load and
version probes. A head that would not be exactly one well-formed HTTP/1.1 request is refused
with `UnsafeRequestError` (400 `unsafe_upstream_request`) and never sent:

- the request target is origin-form (`/` then visible ASCII: no space, CR, LF, NUL, other
  control character or non-ASCII byte);
- every header name is an RFC 9110 token, every value visible ASCII, spaces and tabs (no CR,
  LF, NUL, other control character or non-ASCII).

A query built from client input goes through `target()`: parsed values are percent-encoded
again (`urlencode`), never copied as they arrived or as they were decoded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlencode

from maskgate.protocol.errors import ApiError

_TARGET = re.compile(r"/[\x21-\x7e]*")
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# Every field line at once, in one regex pass over the joined block (the hot path's cost).
_LINES = re.compile(rf"(?:{_TOKEN}: [\t\x20-\x7e]*\r\n)*")
_NAME = re.compile(_TOKEN)
_VALUE = re.compile(r"[\t\x20-\x7e]*")
_NO_BODY = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})


class UnsafeRequestError(ApiError):
    """A request head the gateway refuses to write upstream (the client's input was the
    cause, so the client gets 400)."""

    def __init__(self, message: str) -> None:
        super().__init__("unsafe_upstream_request", message, status=400)


def target(path: str, query: Iterable[tuple[str, str]] = ()) -> str:
    """`path` (a literal of the gateway's own) with `query` percent-encoded again."""
    encoded = urlencode(list(query))
    return f"{path}?{encoded}" if encoded else path


def request_head(
    method: str,
    request_target: str,
    host: str,
    headers: list[tuple[str, str]],
    body_length: int,
) -> bytes:
    """The bytes of one request head (Content-Length added when a body goes, or the method
    carries one); raises UnsafeRequestError instead of writing anything unsafe."""
    if _TARGET.fullmatch(request_target) is None:
        raise UnsafeRequestError(
            f"the upstream request target {request_target[:80]!r} is not origin-form visible "
            "ASCII (no space, CR, LF, NUL or non-ASCII)"
        )
    lines = [f"Host: {host}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers]
    if body_length or method not in _NO_BODY:
        lines.append(f"Content-Length: {body_length}\r\n")
    block = "".join(lines)
    # A CRLF inside a value would make two well-formed lines of one: the lines must be as
    # many as the fields.
    if _LINES.fullmatch(block) is None or block.count("\n") != len(lines):
        raise _bad_field(headers)
    return f"{method} {request_target} HTTP/1.1\r\n{block}\r\n".encode("ascii")


def _bad_field(headers: list[tuple[str, str]]) -> UnsafeRequestError:
    for name, value in headers:
        if _NAME.fullmatch(name) is None:
            return UnsafeRequestError(f"the header name {name[:40]!r} is not an HTTP token")
        if _VALUE.fullmatch(value) is None:
            return UnsafeRequestError(
                f"the {name[:40]} header holds a control character or non-ASCII text"
            )
    return UnsafeRequestError("the upstream Host is not a valid header value")

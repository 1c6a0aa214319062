"""Request bodies sent with `Content-Encoding` on the inference routes.

The gateway must read an inference body to classify it, so it decodes `gzip` (`x-gzip`) and
`deflate` itself, at most two codings deep, and forwards the decoded body without the header.
Decoding stops one byte past `max_body_bytes` of output: the decoded size counts against the
body limit (413 `body_too_large`), so a small compressed body cannot expand into gigabytes
(a zip bomb costs at most `max_body_bytes` of work per coding). Any other coding answers 415
`unsupported_content_encoding`; a body that does not decode answers 400
`invalid_content_encoding`. Other paths are proxied as sent, header included.

aiohttp's own request decompression is turned off for the gateway's app (app.py), so the
bytes read here are the ones the client sent.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from maskgate.protocol.errors import ApiError, PolicyError

# Coding -> zlib window bits (31: gzip wrapper, 15: zlib wrapper as HTTP "deflate" means).
_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}
_MAX_CODINGS = 2


def codings(values: Iterable[str]) -> list[str]:
    """The codings named in every Content-Encoding header, in the order they were applied
    (`identity` dropped)."""
    out = []
    for value in values:
        for token in value.split(","):
            token = token.strip().lower()
            if token and token != "identity":
                out.append(token)
    return out


def decode_body(raw: bytes, applied: list[str], limit: int) -> bytes:
    """Undo `applied` (last applied first). Raises 415, 400 or 413 as the module says."""
    unknown = [c for c in applied if c not in _WBITS]
    if unknown or len(applied) > _MAX_CODINGS:
        raise ApiError(
            "unsupported_content_encoding",
            f"Content-Encoding {', '.join(applied)} is not supported here; send the body "
            f"uncompressed, or with gzip or deflate (at most {_MAX_CODINGS} codings)",
            status=415,
            headers={"Accept-Encoding": "gzip, deflate"},
        )
    body = raw
    for coding in reversed(applied):
        body = _inflate(body, coding, limit)
    return body


def _inflate(data: bytes, coding: str, limit: int) -> bytes:
    wbits = _WBITS[coding]
    try:
        return _inflate_with(data, wbits, coding, limit)
    except zlib.error:
        if coding != "deflate":
            raise _invalid(coding) from None
    try:  # some clients send raw deflate data without the zlib wrapper
        return _inflate_with(data, -15, coding, limit)
    except zlib.error:
        raise _invalid(coding) from None


def _inflate_with(data: bytes, wbits: int, coding: str, limit: int) -> bytes:
    d = zlib.decompressobj(wbits)
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise PolicyError(
            "body_too_large",
            f"the request body decompresses ({coding}) to more than the limit of {limit} bytes",
            status=413,
        )
    if not d.eof or d.unused_data:
        raise _invalid(coding)
    return out


def _invalid(coding: str) -> ApiError:
    return ApiError(
        "invalid_content_encoding",
        f"the request body is not valid {coding} data (truncated, corrupt or with trailing bytes)",
    )

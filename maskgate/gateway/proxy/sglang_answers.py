"""An SGLang mask pool's answers in the gateway's shapes (protocol/engine_rules.py says what
such a pool serves).

SGLang's own error bodies differ by route: `/generate` answers `{"error": {"message"}}`
(400), the OpenAI routes `{"object": "error", "message", "type", "param", "code"}`, and a
stream that fails after its 200 carries `data: {"error": {...}}` as an event. Each comes back
to the client as the gateway's error body (protocol/errors.py), with the upstream's status:
`upstream_invalid_request` for a 4xx, `upstream_error` for a 5xx. SGLang answers masks as
lists; events of a `/generate` stream are converted to packed for the answers that asked.
"""

from __future__ import annotations

from typing import Any

import orjson

from maskgate.gateway.proxy import packed as packing
from maskgate.protocol.errors import ApiError, ServerError, error_event
from maskgate.protocol.mask_format import MASK

_DONE = b"data: [DONE]"
_MAX_MESSAGE = 1000  # characters of an upstream error message kept in the gateway's error
# An event longer than this (a packed 4096-token answer of 4096-id masks is ~90 MB, but SGLang
# streams lists one step at a time) is relayed as it came, and the rest of the stream too.
MAX_EVENT_BYTES = 16 * 1024 * 1024


def error_from_body(raw: bytes, status: int, pool: str) -> ApiError | None:
    """The gateway's error for an SGLang error body; None when `raw` is not one."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    message = _message(data)
    return None if message is None else _error(message, status, pool)


def _message(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    inner = data.get("error")
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return inner["message"]
    if data.get("object") == "error" and isinstance(data.get("message"), str):
        return data["message"]
    return None


def _error(message: str, status: int, pool: str) -> ApiError:
    message = message[:_MAX_MESSAGE]
    if status >= 500:
        return ServerError(
            "upstream_error", f"the {pool} pool (SGLang) failed: {message}", status=status
        )
    return ApiError(
        "upstream_invalid_request",
        f"the {pool} pool (SGLang) refused the request: {message}",
        status=status,
    )


class StreamRewriter:
    """Rewrites an SGLang event stream event by event: error events into the gateway's error
    event, and mask lists into packed for the answers that asked. Bytes of an event that has
    not ended yet wait for the rest of it, up to MAX_EVENT_BYTES; past that the stream is
    relayed unchanged from there on."""

    def __init__(self, pool: str, packed: tuple[bool, ...]) -> None:
        self.pool = pool
        self.packed = packed
        self.pending = b""
        self.bypass = False

    def feed(self, data: bytes) -> bytes:
        if self.bypass:
            return data
        buf = self.pending + data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            if len(buf) > MAX_EVENT_BYTES:
                self.bypass, self.pending = True, b""
                return buf
            self.pending = buf
            return b""
        self.pending = buf[cut + 2 :]
        return b"".join(self._frame(f) for f in buf[:cut].split(b"\n\n"))

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest

    def _frame(self, frame: bytes) -> bytes:
        if not frame.startswith(b"data: ") or frame.startswith(_DONE):
            return frame + b"\n\n"
        try:
            event = orjson.loads(frame[6:])
        except orjson.JSONDecodeError:
            return frame + b"\n\n"
        message = _message(event)
        if message is not None and "meta_info" not in event:
            inner = event.get("error")
            code = inner.get("code") if isinstance(inner, dict) else None
            return error_event(_error(message, code if isinstance(code, int) else 400, self.pool))
        meta = event.get("meta_info") if isinstance(event, dict) else None
        k = event.get("index", 0) if isinstance(event, dict) else 0
        want = self.packed[min(k, len(self.packed) - 1)] if isinstance(k, int) else False
        if want and isinstance(meta, dict) and isinstance(meta.get(MASK), list):
            try:
                packing.to_packed(meta)
            except (TypeError, OverflowError, ValueError):
                return frame + b"\n\n"  # not a list of id lists: relayed as it came
            return b"data: " + orjson.dumps(event) + b"\n\n"
        return frame + b"\n\n"

"""JSON logs: one object per line, with the request's id, pool, upstream, status and latency.

The access line is only built when the `maskgate.access` logger is enabled, so turning it
off (config `access_log: false` or `log_level: warning`) removes its cost from the hot path.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

ACCESS = logging.getLogger("maskgate.access")
LOG = logging.getLogger("maskgate")

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str, access_log: bool) -> None:
    """Route every log record of the process through one JSON handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    ACCESS.disabled = not access_log
    # aiohttp's own access log would duplicate ours.
    logging.getLogger("aiohttp.access").disabled = True


def log_access(
    rid: str,
    method: str,
    path: str,
    route: str,
    pool: str,
    upstream: str | None,
    status: int,
    started: float,
    attempts: int,
) -> None:
    if ACCESS.disabled or not ACCESS.isEnabledFor(logging.INFO):
        return
    ACCESS.info(
        "request",
        extra={
            "request_id": rid,
            "method": method,
            "path": path,
            "route": route,
            "pool": pool,
            "upstream": upstream,
            "status": status,
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
            "attempts": attempts,
        },
    )

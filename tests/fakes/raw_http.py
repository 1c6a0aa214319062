"""One HTTP/1.1 request on a raw socket, the request line exactly as given (an HTTP client
would tidy `//x`, `/./x` or absolute-form targets)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson


async def raw(
    url: str, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """One request on its own connection, the request line exactly as given."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\nConnection: close\r\n\r\n").encode() + body)
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    got = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError:
        parsed = payload
    return int(status_line.split()[1]), got, parsed

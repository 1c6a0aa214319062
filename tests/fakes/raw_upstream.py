"""A fake upstream on raw sockets for the gateway's HTTP client tests: it writes exactly the
bytes a test gives, which no HTTP server library would (smuggling and strictness tests)."""

from __future__ import annotations

import asyncio
import re
from typing import cast

_LENGTH = re.compile(rb"\r\ncontent-length: *([0-9]+)", re.IGNORECASE)


def _take_request(buf: bytes) -> tuple[bytes, bytes] | None:
    """The first whole request in `buf`, framed by Content-Length as an upstream server
    frames it: (its head, the bytes after its body); None while it is not all there."""
    if b"\r\n\r\n" not in buf:
        return None
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = _LENGTH.search(head)
    size = int(length[1]) if length else 0
    if len(rest) < size:
        return None
    return head, rest[size:]


class RawUpstream(asyncio.Protocol):
    """One connection of a fake upstream. The first request the server gets (over all its
    connections) is answered by `first()`, every later one with `canary`. `server` is the
    state its connections share: "connections" counts them, and "on" gets, per request, the
    index of the connection it came on (so a test sees which connection was reused)."""

    canary: bytes

    def __init__(self, server: dict) -> None:
        self.server = server
        self.buf = b""
        self.index = server["connections"]
        server["connections"] += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (taken := _take_request(self.buf)) is not None:
            _, self.buf = taken
            self.server["on"].append(self.index)
            if len(self.server["on"]) == 1:
                asyncio.get_running_loop().create_task(self.first())
            else:
                self.transport.write(self.canary)

    async def first(self) -> None:
        raise NotImplementedError


class RecordingUpstream(asyncio.Protocol):
    """One connection of a fake upstream that keeps every request head it reads, byte for
    byte, in `heads` (framed by Content-Length, as an upstream server frames them), and
    answers each with `answer`. Bytes that do not (yet) make a whole request are kept in
    `leftover`, by connection."""

    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

    def __init__(self, heads: list[bytes], leftover: dict[int, bytes]) -> None:
        self.heads = heads
        self.leftover = leftover
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (taken := _take_request(self.buf)) is not None:
            head, self.buf = taken
            self.heads.append(head)
            self.transport.write(self.answer)
        self.leftover[id(self)] = self.buf

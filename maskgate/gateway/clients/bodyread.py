"""Reading a client's request body, on every route that reads one (inference, control,
registration, admin, the forwarding to the control leader).

A body is read whole, within three bounds:
- `max_body_bytes`: 413 `body_too_large`, from `Content-Length` before anything is read, or
  as soon as the bytes read pass it;
- `clients.body_timeout_s`: the longest silence between two pieces (408 `request_timeout`);
- `clients.body_deadline_s`: the whole body, however it trickles (408 `request_timeout`).

After a 408 the connection closes (connections.py): the rest of the body would otherwise be
read as the next request.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from maskgate.gateway.state import STATE
from maskgate.protocol.errors import ApiError, PolicyError


async def read_body(request: web.Request) -> bytes:
    state = request.app[STATE]
    limit = state.config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise too_large(request.content_length, limit)
    content = request.content
    if content.is_eof():  # the whole body came with the head: the usual case
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as e:
            raise too_large(None, limit) from e
        except RequestPayloadError as e:  # a broken chunked framing, a short body
            raise _unreadable(e) from e
    clients = state.config.clients
    loop = asyncio.get_running_loop()
    deadline = loop.time() + clients.body_deadline_s
    pieces: list[bytes] = []
    size = 0
    while True:
        left = deadline - loop.time()
        wait = min(clients.body_timeout_s, left)
        try:
            if left <= 0:
                raise TimeoutError
            async with asyncio.timeout(wait):
                piece = await content.readany()
        except TimeoutError as e:
            if state.connections is not None:
                state.connections.body_timed_out(request)
            why = (
                f"the request body did not arrive within {clients.body_deadline_s:g} s "
                "(body_deadline_s)"
                if wait < clients.body_timeout_s
                else f"the request body stalled for {clients.body_timeout_s:g} s (body_timeout_s)"
            )
            raise ApiError("request_timeout", why, status=408) from e
        except RequestPayloadError as e:
            raise _unreadable(e) from e
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > limit:
            raise too_large(None, limit)
        pieces.append(piece)


def too_large(size: int | None, limit: int) -> ApiError:
    got = f"{size} bytes" if size is not None else "over the limit"
    return PolicyError("body_too_large", f"request body is {got}; the limit is {limit}", status=413)


def _unreadable(e: RequestPayloadError) -> ApiError:
    return ApiError("invalid_body", f"the request body could not be read: {e}")

"""No client input can make the gateway send an upstream a second request, or a malformed
one: arbitrary strings pushed through every route that copies client input into an upstream
request (the proxied query and headers, the `/flush_cache` fan-out's query, `/v1/loads`'s
`include`, registration's worker URL, control bodies and queries), against an upstream on raw sockets
that records every request head exactly as it arrives.

Property, per call: the gateway either refuses it (4xx, and nothing reaches the upstream)
or exactly one request arrives, well-formed (origin-form target of visible ASCII, token
names, values of visible ASCII, spaces and tabs), on the route's own path, with no bytes
left over.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from urllib.parse import quote

import orjson
from aiohttp.test_utils import TestServer
from fakes.raw_http import raw
from fakes.raw_upstream import RecordingUpstream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maskgate.gateway import GatewayConfig, create_app
from maskgate.gateway.state import STATE
from maskgate.protocol.settings import load_settings

_HEAD = re.compile(
    rb"(GET|POST|PUT) (/[\x21-\x7e]*) HTTP/1\.1"
    rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+: [\t\x20-\x7e]*)*"
)
ATTACKS = [
    "\r\nGET /update_weights_from_disk HTTP/1.1\r\nHost: x\r\n\r\n",
    " HTTP/1.1\r\nX: y",
    "\r\nContent-Length: 0\r\n\r\nPOST /pause_generation HTTP/1.1\r\n",
    "\x00",
    "\n",
    "é中",
    "%0d%0a",
    "a b",
]
text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(ATTACKS),
    st.tuples(st.text(max_size=8), st.sampled_from(ATTACKS)).map("".join),
)
header_value = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=20,
).map(lambda v: v.strip())


Call = tuple[str, str, bytes, dict[str, str], str, int]  # ..., upstream path, most requests


def _config(port: int, health: str | None) -> GatewayConfig:
    url = f"http://127.0.0.1:{port}"
    return load_settings(
        GatewayConfig,
        overrides={
            "host": "127.0.0.1",
            "port": 0,
            "access_log": False,
            "pools": {
                "general": {"endpoints": [url], "health_path": None},
                "mask": {"endpoints": [url], "health_path": health},
            },
            "retries": {"max_attempts": 1},
            "timeouts": {"health_interval_s": 3600},
        },
    )


async def _run(make_calls: Callable[[int], list[Call]], health: str | None = None) -> None:
    """Each call: (method, target, body, headers, the upstream path it may reach, the most
    requests it may cause there: 1, or 0 where it needs none)."""
    heads: list[bytes] = []
    leftover: dict[int, bytes] = {}
    loop = asyncio.get_running_loop()
    upstream = await loop.create_server(lambda: RecordingUpstream(heads, leftover), "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    app = create_app(_config(port, health))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        if health is not None:  # the first health round, before any call
            while not app[STATE].started:
                await asyncio.sleep(0.01)
        app[STATE].started = True
        gateway = f"http://127.0.0.1:{server.port}"
        for method, target, body, headers, path, most in make_calls(port):
            before = len(heads)
            status, _, answer = await raw(gateway, method, target, body, headers)
            await asyncio.sleep(0.01)  # the upstream's protocol has read what was sent
            arrived = heads[before:]
            assert not any(leftover.values()), leftover
            if 400 <= status < 500:
                assert arrived == [], (target, headers, answer, arrived)
                continue
            assert 200 <= status < 300, (target, headers, answer)
            assert len(arrived) <= most, (target, headers, arrived)
            assert len(arrived) == most or most == 0, (target, headers, arrived)
            for head in arrived:
                match = _HEAD.fullmatch(head)
                assert match is not None, head
                assert match[2].partition(b"?")[0] == path.encode(), head
    finally:
        await server.close()
        upstream.close()
        await upstream.wait_closed()


def _query(value: str) -> str:
    return quote(value, safe="")


def _version(value: str) -> bytes:
    return orjson.dumps({"new_version": value.encode("utf-8", "replace").decode() or "v"})


def _json_string(value: str) -> bytes:
    return orjson.dumps({"rid": value.encode("utf-8", "replace").decode()})


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=st.lists(text, min_size=1, max_size=4), header=header_value)
def test_client_input_never_smuggles_a_request_upstream(values: list[str], header: str):
    def calls(port: int) -> list[Call]:
        out: list[Call] = []
        for value in values:
            q = _query(value)
            completion = b'{"prompt": "x"}'
            out += [
                ("POST", f"/v1/completions?x={q}", completion, {}, "/v1/completions", 1),
                ("POST", "/v1/completions", completion, {"X-Any": header}, "/v1/completions", 1),
                ("GET", f"/v1/models?{q}={q}", b"", {}, "/v1/models", 1),
                ("PUT", f"/generate?rid={q}", b'{"text": "x"}', {}, "/generate", 1),
                ("POST", f"/flush_cache?{q}={q}", b"", {}, "/flush_cache", 1),
                ("GET", f"/flush_cache?x={q}", b"", {"X-Any": header}, "/flush_cache", 1),
                ("GET", f"/v1/loads?include={q}", b"", {}, "/v1/loads", 1),
                ("POST", "/abort_request", _json_string(value), {}, "/abort_request", 1),
                ("POST", "/pause_generation", _json_string(value), {}, "/pause_generation", 1),
                ("POST", f"/continue_generation?{q}", b"", {}, "/continue_generation", 1),
                (
                    "POST",
                    f"/update_weight_version?v={q}",
                    _version(value),
                    {},
                    "/update_weight_version",
                    1,
                ),
            ]
        return out

    asyncio.run(_run(calls))


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(suffix=text)
def test_registration_urls_never_smuggle_a_request(suffix: str):
    """A worker URL with anything after the port is refused (400), or names the same worker
    (nothing to check) or another port (checked there); the proxied request after it still
    reaches the upstream as exactly one request."""

    def calls(port: int) -> list[Call]:
        url = _query(f"http://127.0.0.1:{port}{suffix}")
        return [
            ("POST", f"/add_worker?url={url}", b"", {}, "/health", 0),
            ("GET", "/list_workers", b"", {}, "/", 0),
            ("POST", "/v1/completions", b'{"prompt": "x"}', {}, "/v1/completions", 1),
        ]

    asyncio.run(_run(calls, health="/health"))

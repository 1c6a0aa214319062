"""Request bodies with Content-Encoding on the inference routes: decoded within
the body limit and checked, or refused with a clear code; never a 500."""

from __future__ import annotations

import gzip
import zlib

import orjson
import pytest
from fakes.bodies import BAD_GEN, MASK_GEN_CAPPED
from fakes.raw_http import raw

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, no zlib wrapper
        ("gzip, gzip", lambda b: gzip.compress(gzip.compress(b))),
        ("identity", lambda b: b),
    ],
)
async def test_compressed_bodies_are_decoded_and_checked(
    upstreams, gateway, make_config, coding, encode
):
    mask = await upstreams()
    async with gateway(make_config([], [mask.url])) as gw:
        for body, want in ((BAD_GEN, 400), (MASK_GEN_CAPPED, 200)):
            status, _, _ = await raw(
                gw.url,
                "POST",
                "/generate",
                encode(orjson.dumps(body)),
                {"Content-Encoding": coding},
            )
            assert status == want
    assert len(mask.requests) == 1
    assert "Content-Encoding" not in mask.requests[0].headers
    assert mask.requests[0].json()["text"] == "x"


@pytest.mark.parametrize(
    ("coding", "body", "status", "code"),
    [
        ("br", b"\x00\x01", 415, "unsupported_content_encoding"),
        ("zstd", b"\x00\x01", 415, "unsupported_content_encoding"),
        ("gzip, br", b"\x00", 415, "unsupported_content_encoding"),
        ("gzip, gzip, gzip", b"\x00", 415, "unsupported_content_encoding"),
        ("gzip", b"not gzip", 400, "invalid_content_encoding"),
        ("gzip", gzip.compress(b'{"text": "x"}', mtime=0)[:-6], 400, "invalid_content_encoding"),
        ("gzip", gzip.compress(b"{}", mtime=0) + b"trailing", 400, "invalid_content_encoding"),
        ("gzip", gzip.compress(b" " * (16 * 1024 * 1024), mtime=0), 413, "body_too_large"),
        ("deflate", zlib.compress(b"[" * (9 * 1024 * 1024)), 413, "body_too_large"),
    ],
)
async def test_bad_encodings_get_clear_errors(
    upstreams, gateway, make_config, coding, body, status, code
):
    general = await upstreams()
    async with gateway(make_config([general.url], max_body_bytes=8 * 1024 * 1024)) as gw:
        got, _, answer = await raw(gw.url, "POST", "/generate", body, {"Content-Encoding": coding})
        assert (got, answer["error"]["code"]) == (status, code)
        text = await gw.metrics()
        assert f'maskgate_rejections_total{{code="{code}"}} 1.0' in text
    assert general.requests == []


async def test_other_paths_forward_compressed_bodies_as_sent(upstreams, gateway, make_config):
    general = await upstreams()
    packed = gzip.compress(b'{"input": "x"}')
    async with gateway(make_config([general.url])) as gw:
        status, _, _ = await raw(
            gw.url, "POST", "/v1/embeddings", packed, {"Content-Encoding": "gzip"}
        )
        assert status == 200
    # The fake upstream (aiohttp) decodes what it receives: the bytes went up compressed,
    # with their header.
    assert general.requests[0].headers["Content-Encoding"] == "gzip"
    assert general.requests[0].headers["Content-Length"] == str(len(packed))
    assert general.requests[0].body == b'{"input": "x"}'

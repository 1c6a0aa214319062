"""Classes of gateway holes through HTTP: every method and spelling of an inference
path is classified, client-address and Connection-listed headers, and what the gateway adds
to a body upstream. Raw sockets send targets an HTTP client would tidy."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from fakes.bodies import BAD_GEN, MASK_CHAT, MASK_GEN_CAPPED
from fakes.raw_http import raw

pytestmark = pytest.mark.integration


# Spellings aiohttp's router reads as the declared path (it decodes %-escapes, takes the
# path of an absolute-form target): the route serves them.
SERVED = ("/generate", "/%67enerate", "/generate?x=1", "http://elsewhere/generate")
# Any other spelling is not a declared route: 404, and nothing reaches an upstream.
UNDECLARED = (
    "/generate/",
    "//generate",
    "/./generate",
    "/x/../generate",
    "/GENERATE",
    "/%2567enerate",
    "/generate;v=1",
)


@pytest.mark.parametrize("target", [*SERVED, *UNDECLARED])
@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_every_spelling_and_method_of_generate_is_checked_or_404(
    upstreams, gateway, make_config, target, method
):
    general = await upstreams()
    mask = await upstreams()
    async with gateway(make_config([general.url], [mask.url])) as gw:
        status, _, body = await raw(gw.url, method, target, orjson.dumps(BAD_GEN))
        if target in UNDECLARED:
            assert (status, body["error"]["code"]) == (404, "not_found")
            status, _, _ = await raw(gw.url, method, target, orjson.dumps(MASK_GEN_CAPPED))
            assert status == 404
        else:
            assert (status, body["error"]["code"]) == (400, "sampling_mask_full_vocabulary")
            status, _, _ = await raw(gw.url, method, target, orjson.dumps(MASK_GEN_CAPPED))
            assert status == 200
    assert general.requests == []
    # The row's own path is what goes upstream, so the policy and the router agree.
    sent = [] if target in UNDECLARED else [(method, "/generate")]
    assert [(r.method, r.path) for r in mask.requests] == sent


@pytest.mark.parametrize(
    "target",
    [
        "//v1/chat/completions",
        "/V1/Chat/Completions",
        "/v1%2Fchat%2Fcompletions",
        "/v1//chat/./completions/",
    ],
)
async def test_other_chat_spellings_reach_no_pool(upstreams, gateway, make_config, target):
    general = await upstreams()
    mask = await upstreams()
    async with gateway(make_config([general.url], [mask.url])) as gw:
        status, _, body = await raw(gw.url, "POST", target, orjson.dumps(MASK_CHAT))
        assert (status, body["error"]["code"]) == (404, "not_found")
    assert general.requests == [] and mask.requests == []


@pytest.mark.parametrize(
    ("method", "target", "allow"),
    [
        ("GET", "/generate", "POST, PUT"),
        ("PATCH", "/generate", "POST, PUT"),
        ("DELETE", "/generate", "POST, PUT"),
        ("PUT", "/v1/chat/completions", "POST"),
        ("GET", "/v1/completions", "POST"),
        ("OPTIONS", "/v1/chat/completions", "POST"),
    ],
)
async def test_methods_an_inference_route_does_not_take_get_405(
    upstreams, gateway, make_config, method, target, allow
):
    general = await upstreams()
    mask = await upstreams()
    async with gateway(make_config([general.url], [mask.url])) as gw:
        status, headers, body = await raw(gw.url, method, target, orjson.dumps(MASK_GEN_CAPPED))
        assert (status, body["error"]["code"]) == (405, "method_not_allowed")
        assert headers["allow"] == allow
        assert set(body["error"]) == {"message", "type", "param", "code"}
    assert general.requests == [] and mask.requests == []


async def test_declared_routes_without_sampling_pass_through(upstreams, gateway, make_config):
    general = await upstreams()
    async with gateway(make_config([general.url])) as gw:
        status, _, _ = await raw(gw.url, "POST", "/v1/embeddings", b'{"return_sampling_mask": 1}')
        assert status == 200
        status, _, _ = await raw(gw.url, "GET", "/v1/models")
        assert status == 200
    assert [r.path for r in general.requests] == ["/v1/embeddings", "/v1/models"]


# --- headers ----------------------------------------------------------------------------

SPOOF = {"X-Forwarded-For": "1.2.3.4", "Forwarded": "for=1.2.3.4", "X-Real-IP": "1.2.3.4"}


async def test_client_address_headers_are_dropped_from_untrusted_peers(
    upstreams, gateway, make_config
):
    general = await upstreams()
    async with gateway(make_config([general.url])) as gw:
        await gw.post("/v1/completions", {"prompt": "x"}, headers=SPOOF)
        await gw.post("/v1/embeddings", {"input": "x"}, headers=SPOOF)
    for received in general.requests:
        assert not {"X-Forwarded-For", "Forwarded", "X-Real-IP"} & set(received.headers)


async def test_trusted_proxies_chain_is_kept_and_extended(upstreams, gateway, make_config):
    general = await upstreams()
    async with gateway(make_config([general.url], trusted_proxies=["127.0.0.0/8"])) as gw:
        await gw.post("/v1/completions", {"prompt": "x"}, headers=SPOOF)
        await gw.post("/v1/completions", {"prompt": "x"})
    first, second = (r.headers for r in general.requests)
    assert first["X-Forwarded-For"] == "1.2.3.4, 127.0.0.1"
    assert first["Forwarded"] == "for=1.2.3.4, for=127.0.0.1"
    assert first["X-Real-IP"] == "1.2.3.4"
    assert second["X-Forwarded-For"] == "127.0.0.1" and "Forwarded" not in second


async def test_every_header_named_in_any_connection_header_is_dropped(
    upstreams, gateway, make_config
):
    general = await upstreams()
    async with gateway(make_config([general.url])) as gw:
        status, _, _ = await raw(
            gw.url,
            "POST",
            "/v1/completions",
            b'{"prompt": "x"}',
            {
                "Connection": "keep-alive, X-One",
                "connection": "x-two ,X-Three",
                "X-One": "1",
                "X-Two": "2",
                "X-Three": "3",
                "X-Kept": "4",
            },
        )
        assert status == 200
    got = general.requests[0].headers
    assert not {"X-One", "X-Two", "X-Three"} & set(got)
    assert got["X-Kept"] == "4"


# --- what the gateway adds to bodies ----------------------------------------------------


async def test_general_bodies_are_never_rewritten(upstreams, gateway, make_config):
    general = await upstreams()
    batch = orjson.dumps({"text": ["a"] * 20000, "sampling_params": {"max_new_tokens": 1}})
    async with gateway(make_config([general.url])) as gw:
        status, _, resp = await gw.post("/generate", batch)
        assert status == 200
    assert general.requests[0].body == batch
    assert general.requests[0].headers["X-Request-Id"] == resp.headers["X-Request-Id"]


@pytest.mark.parametrize("items", [1, 10, 4096])
async def test_mask_batches_grow_by_a_bounded_number_of_bytes(
    upstreams, gateway, make_config, items
):
    mask = await upstreams()
    body = {
        "text": ["a"] * items,
        "return_sampling_mask": True,
        "sampling_params": {"top_k": 3, "max_new_tokens": 4, "top_p": 0.9, "min_p": 0.0},
    }
    async with gateway(make_config([], [mask.url])) as gw:
        status, _, resp = await gw.post("/generate", body)
        assert status == 200
    forwarded = mask.requests[0]
    assert forwarded.json()["rid"] == resp.headers["X-Request-Id"]
    # One rid string and the resolved temperature: the same few bytes at any batch size.
    assert len(forwarded.body) - len(orjson.dumps(body)) <= 64


async def test_response_headers_named_in_connection_are_dropped(gateway, make_config):
    """An upstream answer's Connection-listed headers never reach the client."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(
                (
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                b"0",
            )
        )
        await reader.readexactly(length)
        if head.startswith(b"GET /health"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nConnection: x-also\r\n"
                b"X-Hop: 1\r\nX-Also: 2\r\nX-End: 3\r\nContent-Length: 2\r\n\r\n{}"
            )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        config = make_config([f"http://127.0.0.1:{port}"], pools={"general": {"health_path": None}})
        async with gateway(config) as gw:
            status, headers, _ = await raw(gw.url, "POST", "/v1/embeddings", b"{}")
    finally:
        server.close()
    assert status == 200
    assert headers["x-end"] == "3" and "x-hop" not in headers and "x-also" not in headers


async def test_put_generate_is_subject_to_the_mask_allow_list(upstreams, gateway, make_config):
    mask = await upstreams()
    config = make_config([], [mask.url], api_keys=["k-train", "k-app"], mask_allow_keys=["k-train"])
    async with gateway(config) as gw:
        body = orjson.dumps(MASK_GEN_CAPPED)
        status, _, answer = await raw(
            gw.url, "PUT", "/generate", body, {"Authorization": "Bearer k-app"}
        )
        assert (status, answer["error"]["code"]) == (403, "sampling_mask_forbidden")
        status, _, _ = await raw(
            gw.url, "PUT", "/generate", body, {"Authorization": "Bearer k-train"}
        )
        assert status == 200
    assert len(mask.requests) == 1

"""outbound.py, the one writer of upstream request heads: what it refuses, and that a query
made from client input is percent-encoded again, whatever the input."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maskgate.gateway.upstream.outbound import UnsafeRequestError, request_head, target


def test_a_well_formed_head():
    head = request_head("POST", "/generate?a=1", "w:1", [("X-A", "b c\td")], 3)
    assert (
        head
        == b"POST /generate?a=1 HTTP/1.1\r\nHost: w:1\r\nX-A: b c\td\r\nContent-Length: 3\r\n\r\n"
    )
    assert b"Content-Length" not in request_head("GET", "/x", "w", [], 0)
    assert b"Content-Length: 0" in request_head("POST", "/x", "w", [], 0)


@pytest.mark.parametrize(
    "bad_target",
    ["/a b", "/a\r\nX: y", "/a\n", "/a\x00", "/é", "http://x/a", "", "*", "/a\x7f"],
)
def test_targets_that_are_not_visible_ascii_are_refused(bad_target):
    with pytest.raises(UnsafeRequestError) as info:
        request_head("GET", bad_target, "w", [], 0)
    assert (info.value.status, info.value.code) == (400, "unsafe_upstream_request")


@pytest.mark.parametrize(
    "header",
    [
        ("X", "a\r\nX-Smuggled: 1"),
        ("X", "a\r\n\r\nGET / HTTP/1.1"),
        ("X", "a\nb"),
        ("X", "a\rb"),
        ("X", "a\x00"),
        ("X", "é"),
        ("X", "\x1b[0m"),
        ("X Y", "a"),
        ("X:Y", "a"),
        ("", "a"),
        ("X\r\nY", "a"),
    ],
)
def test_headers_that_could_break_the_head_are_refused(header):
    with pytest.raises(UnsafeRequestError):
        request_head("GET", "/x", "w", [("A", "ok"), header], 0)


@given(st.lists(st.tuples(st.text(), st.text()), max_size=4))
def test_a_query_is_encoded_again_and_means_what_it_held(pairs):
    made = target("/flush_cache", pairs)
    request_head("GET", made, "w", [], 0)  # never refused
    path, _, query = made.partition("?")
    assert path == "/flush_cache"
    decoded = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)]
    encodable = [
        (k.encode("utf-8", "replace").decode(), v.encode("utf-8", "replace").decode())
        for k, v in pairs
    ]
    assert decoded == encodable

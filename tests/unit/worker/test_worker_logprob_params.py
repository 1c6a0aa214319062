"""Raw log-prob options (validation) and their response shapes (SGLang triples, OpenAI)."""

from __future__ import annotations

from typing import Any

import pytest

from maskgate.protocol.errors import ApiError
from maskgate.worker.server.logprob_format import (
    chat_logprobs,
    completion_logprobs,
    top_triples,
    triples,
)
from maskgate.worker.server.logprob_params import (
    LogprobOptions,
    parse_generate_logprobs,
    parse_openai_logprobs,
)


class Tok:
    """Each id decodes to a fixed string; id 9 is half a multi-byte character."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join("\ufffd" if i == 9 else f"<{i}>" for i in ids)


def refused(fn: Any, *args: Any, **kw: Any) -> str | None:
    with pytest.raises(ApiError) as info:
        fn(*args, **kw)
    assert info.value.status == 400 and info.value.code == "invalid_parameter"
    assert info.value.message
    return info.value.param


def test_generate_defaults_and_lists() -> None:
    assert parse_generate_logprobs({}, [3], False) == [None]
    assert parse_generate_logprobs({"return_logprob": True}, [3], False) == [LogprobOptions()]
    body = {
        "return_logprob": [True, False, True],
        "top_logprobs_num": [2, 0, 0],
        "logprob_start_len": [0, -1, 4],
        "return_text_in_logprobs": True,
    }
    a, b, c = parse_generate_logprobs(body, [3, 3, 5], True)
    assert a == LogprobOptions(2, 0, True) and b is None and c == LogprobOptions(0, 4, True)
    # Options without return_logprob are accepted and mean nothing (clients send defaults).
    assert parse_generate_logprobs({"top_logprobs_num": 5}, [3], False) == [None]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"return_logprob": 1}, "return_logprob"),
        ({"return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
        ({"return_logprob": True, "top_logprobs_num": 2.0}, "top_logprobs_num"),
        ({"return_logprob": True, "top_logprobs_num": True}, "top_logprobs_num"),
        ({"return_logprob": True, "top_logprobs_num": 5000}, "top_logprobs_num"),
        ({"return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
        ({"return_logprob": True, "logprob_start_len": 3}, "logprob_start_len"),
        ({"return_logprob": True, "return_text_in_logprobs": "yes"}, "return_text_in_logprobs"),
        ({"return_logprob": [True]}, "return_logprob"),  # a list for a single prompt
    ],
)
def test_generate_bad_values_are_refused(body: dict[str, Any], param: str) -> None:
    assert refused(parse_generate_logprobs, body, [3], False) == param


def test_generate_batch_list_length_must_match() -> None:
    body = {"return_logprob": True, "top_logprobs_num": [1, 2, 3]}
    assert refused(parse_generate_logprobs, body, [3, 3], True) == "top_logprobs_num"
    body = {"return_logprob": [True, "x"]}
    assert refused(parse_generate_logprobs, body, [3, 3], True) == "return_logprob[1]"


def test_openai_options() -> None:
    assert parse_openai_logprobs({}, chat=True) is None
    assert parse_openai_logprobs({"logprobs": False}, chat=True) is None
    assert parse_openai_logprobs({"logprobs": True}, chat=True) == LogprobOptions(0, -1, True)
    got = parse_openai_logprobs({"logprobs": True, "top_logprobs": 5}, chat=True)
    assert got == LogprobOptions(5, -1, True)
    assert parse_openai_logprobs({"logprobs": 3}, chat=False) == LogprobOptions(3, -1, True)
    assert parse_openai_logprobs({"logprobs": 0}, chat=False) == LogprobOptions(0, -1, True)
    assert parse_openai_logprobs({"logprobs": None}, chat=False) is None


@pytest.mark.parametrize(
    ("body", "chat", "param"),
    [
        ({"logprobs": 1}, True, "logprobs"),
        ({"top_logprobs": 2}, True, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, True, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": "2"}, True, "top_logprobs"),
        ({"logprobs": True}, False, "logprobs"),
        ({"logprobs": -1}, False, "logprobs"),
        ({"logprobs": 21}, False, "logprobs"),
    ],
)
def test_openai_bad_values_are_refused(body: dict[str, Any], chat: bool, param: str) -> None:
    assert refused(parse_openai_logprobs, body, chat=chat) == param


def test_sglang_triples() -> None:
    assert triples([-0.5, None], [4, 7], None) == [[-0.5, 4, None], [None, 7, None]]
    text = Tok().decode
    assert triples([-0.5], [4], lambda i: text([i])) == [[-0.5, 4, "<4>"]]
    tops = top_triples([None, [(-0.1, 3), (-2.0, 5)]], None)
    assert tops == [None, [[-0.1, 3, None], [-2.0, 5, None]]]


def test_openai_chat_shape() -> None:
    got = chat_logprobs([-0.25, -1.5], [4, 9], [[(-0.25, 4)], [(-0.5, 2)]], Tok())
    assert got["refusal"] is None
    first, second = got["content"]
    assert first == {
        "token": "<4>",
        "logprob": -0.25,
        "bytes": list(b"<4>"),
        "top_logprobs": [{"token": "<4>", "logprob": -0.25, "bytes": list(b"<4>")}],
    }
    assert second["token"] == "\ufffd" and second["bytes"] == list("\ufffd".encode())
    assert chat_logprobs([-0.25], [4], None, Tok())["content"][0]["top_logprobs"] == []


def test_openai_completion_shape() -> None:
    got = completion_logprobs([-0.25, -1.5], [4, 12], [[(-0.25, 4)], [(-0.5, 2)]], Tok(), 7)
    assert got == {
        "tokens": ["<4>", "<12>"],
        "token_logprobs": [-0.25, -1.5],
        "top_logprobs": [{"<4>": -0.25}, {"<2>": -0.5}],
        "text_offset": [7, 10],
    }
    assert completion_logprobs([-0.25], [4], None, Tok())["top_logprobs"] is None

"""Packed masks at the gateway (gateway/packed.py, maskcheck.finish_mask_response) and the
format and engine rules (protocol/mask_format.py, protocol/engine_rules.py)."""

from __future__ import annotations

import base64
import random
from typing import Any

import orjson
import pytest

from maskgate.gateway.observability.metrics import GatewayMetrics
from maskgate.gateway.proxy import packed as packing
from maskgate.gateway.proxy.maskcheck import finish_mask_response
from maskgate.protocol.engine_rules import check_engine
from maskgate.protocol.errors import ApiError, PolicyError
from maskgate.protocol.mask_format import answer_formats
from maskgate.protocol.policy import Route
from tests.mask_formats import masks_of

MASKS = [[7, 3], [5], [9, 1, 4]]


def lists_meta(masks: list[list[int]]) -> dict[str, Any]:
    return {
        "output_token_sampling_mask": masks,
        "output_token_sampling_logprobs": [-0.2] * len(masks),
        "output_token_sampling_mask_length": len(masks),
        "completion_tokens": len(masks),
    }


def test_lists_to_packed_and_back() -> None:
    meta = lists_meta([list(m) for m in MASKS])
    packing.to_packed(meta)
    assert "output_token_sampling_mask" not in meta
    assert masks_of(meta) == [sorted(m) for m in MASKS]
    ids, offsets = packing.decode(meta)
    assert offsets.tolist() == [0, 2, 3, 6]
    packing.to_lists(meta, ids, offsets)
    assert meta["output_token_sampling_mask"] == [[3, 7], [5], [1, 4, 9]]


@pytest.mark.parametrize("value", ["not base64!", "AAA=", 5])
def test_undecodable_fields_are_refused(value: Any) -> None:
    with pytest.raises(packing.PackedMaskError):
        packing.decode({"output_token_sampling_mask_ids": value,
                        "output_token_sampling_mask_offsets": "AAAAAA=="})  # fmt: skip


def finish(body: Any, packed: tuple[bool, ...], route: str = "generate") -> tuple[Any, str]:
    m = GatewayMetrics()
    raw = orjson.dumps(body)
    out = finish_mask_response(route, raw, "mask", m, packed, vocab_size=16)
    return (out is raw, orjson.loads(out)), m.render().decode()


def test_lists_to_a_lists_request_pass_as_bytes() -> None:
    (same, _), _ = finish({"output_ids": [7, 5, 9], "meta_info": lists_meta(MASKS)}, (False,))
    assert same


def test_per_answer_formats_and_a_token_outside_its_packed_mask() -> None:
    body = [
        {"output_ids": [7, 5, 9], "meta_info": lists_meta(MASKS)},
        {"output_ids": [7, 5, 2], "meta_info": lists_meta(MASKS)},
    ]
    (same, out), _ = finish(body, (True, False))
    assert not same
    assert "output_token_sampling_mask_ids" in out[0]["meta_info"]
    assert out[1]["meta_info"]["output_token_sampling_mask"] == MASKS
    # A packed answer passes as its bytes; one converted to lists is decoded, and then
    # each sampled token is checked against its mask too.
    (same, _), _ = finish(out[0], (True,))
    assert same
    (same, back), text = finish(out[0] | {"output_ids": [7, 5, 2]}, (False,))
    assert not same and back["meta_info"]["output_token_sampling_mask"] == [[3, 7], [5], [1, 4, 9]]
    assert 'maskgate_mask_invariant_violations_total{kind="token_outside_mask"} 1.0' in text


def packed_meta(ids: list[int], offsets: list[int]) -> dict[str, Any]:
    def b64(values: list[int]) -> str:
        raw = b"".join(v.to_bytes(4, "little", signed=True) for v in values)
        return base64.b64encode(raw).decode()

    return {"output_token_sampling_mask_ids": b64(ids),
            "output_token_sampling_mask_offsets": b64(offsets)}  # fmt: skip


@pytest.mark.parametrize("vocab", [1, 2, 1000, 1024, 1025, 151_936, 2**24, 2**31 - 1])
def test_the_cheap_id_bound_is_the_vocabulary_rounded_to_a_power_of_two(vocab: int) -> None:
    rng = random.Random(vocab)
    bound = 1 << max(1, (vocab - 1).bit_length())
    for n in (1, 2, 3, 4, 5, 7):
        for bad in (None, bound, bound + rng.randrange(1000), -1, -(2**31)):
            if bad is not None and bad >= 2**31:
                continue  # not an int32
            ids = [rng.randrange(vocab) for _ in range(n)]
            if bad is not None:
                ids[rng.randrange(n)] = bad
            meta = packed_meta(ids, [0, n])
            offsets = packing.offsets_of(meta)
            if bad is None or 0 <= bad < bound:
                packing.check_ids(meta, offsets, vocab)
            else:
                with pytest.raises(packing.PackedMaskError, match="vocabulary"):
                    packing.check_ids(meta, offsets, vocab)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("AAAA", "id count"), ("AAAAAAAA", "id count"), ("AA=A", "base64"), ("AA", "base64"),
     ("AA*AAA==", "base64"), ("\u00e9AAAAAAA", "base64")],
)  # fmt: skip
def test_malformed_id_text(text: str, problem: str) -> None:
    meta = packed_meta([], [0, 1])
    meta["output_token_sampling_mask_ids"] = text
    with pytest.raises(packing.PackedMaskError, match=problem):
        packing.check_ids(meta, packing.offsets_of(meta), None)


def test_unpackable_lists_for_a_packed_request_are_a_502() -> None:
    with pytest.raises(ApiError) as e:
        finish({"output_ids": [1], "meta_info": lists_meta([["x"]])}, (True,))
    assert (e.value.status, e.value.code) == (502, "upstream_invalid_mask")


def test_answer_formats_expand_by_n_when_mixed() -> None:
    body = {
        "text": ["a", "b"],
        "sampling_mask_format": ["packed", "lists"],
        "sampling_params": [{"n": 2}, {"n": 3}],
    }
    assert answer_formats(body, 2) == (True, True, False, False, False)
    assert answer_formats({"sampling_mask_format": "packed"}, None) == (True,)
    assert answer_formats({}, None) == (False,)


def test_engine_rules_pass_maskgate_and_finite_top_k() -> None:
    body = {"sampling_params": {"top_k": -1}, "return_sampling_mask": True}
    check_engine(Route.GENERATE, body, "maskgate", 64, "mask")
    ok = {"sampling_params": [{"top_k": 5}, {"top_k": -1}], "return_sampling_mask": [True, False]}
    check_engine(Route.GENERATE, ok, "sglang", 64, "mask")
    with pytest.raises(PolicyError) as e:
        check_engine(Route.GENERATE, body, "sglang", 64, "mask")
    assert e.value.code == "sampling_mask_engine_unsupported"
    assert "engine: maskgate" in e.value.message and "top_k <= 64" in e.value.message


@pytest.mark.parametrize(
    ("route", "extra", "ok"),
    [
        (Route.GENERATE, {"sampling_mask_format": "packed"}, True),
        (Route.GENERATE, {"sampling_mask_format": None}, True),
        (Route.GENERATE, {"text": ["a", "b"], "sampling_mask_format": ["lists", "packed"]}, True),
        (Route.GENERATE, {"text": ["a", "b"], "sampling_mask_format": ["packed"]}, False),
        (Route.GENERATE, {"sampling_mask_format": ["packed"]}, False),
        (Route.GENERATE, {"sampling_mask_format": "PACKED"}, False),
        (Route.CHAT, {"sampling_mask_format": "packed"}, True),
        (Route.CHAT, {"sampling_mask_format": ["packed"]}, False),
        (Route.COMPLETIONS, {"sampling_mask_format": True}, False),
    ],
)
def test_policy_checks_the_format(route: Route, extra: dict[str, Any], ok: bool) -> None:
    from maskgate.protocol.policy import PolicyConfig, check_mask_request

    body: dict[str, Any] = {"return_sampling_mask": True, "top_p": 0.9, "return_meta_info": True}
    if route is Route.GENERATE:
        body = {"text": "a", "return_sampling_mask": True, "sampling_params": {"top_p": 0.9}}
    body.update(extra)
    if ok:
        assert (
            check_mask_request(route, body, PolicyConfig())["sampling_mask_format"]
            == extra["sampling_mask_format"]
        )
        return
    with pytest.raises(PolicyError) as e:
        check_mask_request(route, body, PolicyConfig())
    assert e.value.code == "sampling_mask_invalid_param"


def test_stream_rewriter_events_split_anywhere_and_a_bounded_buffer() -> None:
    from maskgate.gateway.proxy import sglang_answers

    event = {"text": "x", "output_ids": [3], "meta_info": lists_meta([[9, 3]])}
    stream = b"data: " + orjson.dumps(event) + b"\n\n" + b'data: {"error": {"message": "no"}}\n\n'
    rw = sglang_answers.StreamRewriter("mask", (True,))
    out = b"".join(rw.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + rw.flush()
    first, second = (orjson.loads(f[6:]) for f in out.split(b"\n\n")[:2])
    assert masks_of(first["meta_info"]) == [[3, 9]]
    assert second["error"]["code"] == "upstream_invalid_request"
    big = sglang_answers.StreamRewriter("mask", (True,))
    chunk = b"x" * (sglang_answers.MAX_EVENT_BYTES // 2 + 1)
    assert big.feed(chunk) == b""
    assert big.feed(chunk) == chunk * 2 and big.feed(b"data: y\n\n") == b"data: y\n\n"

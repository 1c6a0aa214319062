"""Packed masks at the gateway (gateway/packed.py, maskcheck.finish_mask_response) and the
format and engine rules (protocol/mask_format.py, protocol/engine_rules.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from maskgate.gateway import packed as packing
from maskgate.gateway.maskcheck import finish_mask_response
from maskgate.gateway.metrics import GatewayMetrics
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
    # Packed as it comes back from the pool: checked, the violation counted, bytes kept.
    (same, _), text = finish(out[0] | {"output_ids": [7, 5, 2]}, (True,))
    assert same
    assert 'maskgate_mask_invariant_violations_total{kind="token_outside_mask"} 1.0' in text


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

"""Mask response checks: support sizes and invariant violations, in both SGLang shapes."""

from __future__ import annotations

import orjson

from maskgate.gateway.observability.metrics import GatewayMetrics
from maskgate.gateway.proxy.maskcheck import check_mask_response


def meta(masks, logprobs=None, length=None):
    return {
        "output_token_sampling_mask": masks,
        "output_token_sampling_logprobs": [-0.1] * len(masks) if logprobs is None else logprobs,
        "output_token_sampling_mask_length": len(masks) if length is None else length,
    }


def check(route, body):
    m = GatewayMetrics()
    found = check_mask_response(route, orjson.dumps(body), "mask", m)
    return found, m.render().decode()


def test_clean_generate_response_records_support_sizes():
    found, text = check("generate", {"output_ids": [3, 7], "meta_info": meta([[3], [5, 7, 9]])})
    assert found == set()
    assert 'maskgate_mask_support_size_count{pool="mask"} 2.0' in text
    assert 'maskgate_mask_support_size_bucket{le="1.0",pool="mask"} 1.0' in text


def test_generate_batch_items_without_masks_are_skipped():
    body = [{"output_ids": [1], "meta_info": {"id": "x"}},
            {"output_ids": [2], "meta_info": meta([[2, 4]])}]  # fmt: skip
    assert check("generate", body)[0] == set()


def test_each_violation_kind():
    cases = {
        "token_outside_mask": {"output_ids": [3, 8], "meta_info": meta([[3], [5, 7]])},
        "logprob_count": {"output_ids": [3], "meta_info": meta([[3]], logprobs=[])},
        "mask_count": {"output_ids": [3, 4], "meta_info": meta([[3]])},
        "malformed": {"output_ids": [3], "meta_info": meta([[]])},
    }
    for kind, body in cases.items():
        found, text = check("generate", body)
        assert found == {kind}, kind
        assert f'maskgate_mask_invariant_violations_total{{kind="{kind}"}} 1.0' in text
    assert check("generate", {"meta_info": meta([[1]], length=4)})[0] == {"mask_count"}


def test_malformed_masks_among_good_ones_are_one_kind_each():
    mixed = meta([[3], "x", [], {"a": 1}, [5, 6]])
    found, text = check("generate", {"output_ids": [3, 4, 4, 4, 6], "meta_info": mixed})
    assert found == {"malformed"}  # counts agree; the good masks hold their tokens
    assert 'maskgate_mask_support_size_count{pool="mask"} 2.0' in text  # [3] and [5, 6]
    found, _ = check("generate", {"output_ids": [3, 4, 4, 4, 7], "meta_info": mixed})
    assert found == {"malformed", "token_outside_mask"}


def test_chat_shape_and_missing_token_ids():
    ok = {"choices": [{"index": 0, "meta_info": meta([[1, 2], [3]]), "token_ids": [2, 3]}]}
    assert check("chat", ok)[0] == set()
    # Without token ids only the counts can be checked.
    no_ids = {"choices": [{"index": 0, "meta_info": meta([[1, 2], [3]])}]}
    assert check("completions", no_ids)[0] == set()
    bad = {"choices": [{"index": 0, "meta_info": meta([[1, 2], [3]]), "token_ids": [2, 4]}]}
    assert check("chat", bad)[0] == {"token_outside_mask"}


def test_unparseable_body_is_malformed():
    m = GatewayMetrics()
    assert check_mask_response("chat", b"<html>", "mask", m) == {"malformed"}
    assert check("chat", {"choices": "x"})[0] == {"malformed"}

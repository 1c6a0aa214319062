"""The real `openai` client, pointed at the gateway, asks for masks through `extra_body`."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.integration

MASK_FIELDS = {
    "return_sampling_mask": True,
    "return_meta_info": True,
    "return_token_ids": True,
    "top_k": 20,
}


async def test_openai_client_reads_masks_back(upstreams, gateway, make_config):
    general = await upstreams(name="general")
    mask = await upstreams(name="mask")
    config = make_config([general.url], [mask.url], api_keys=["sk-train"])
    async with gateway(config) as gw:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-train", max_retries=0)
        try:
            resp = await client.chat.completions.create(
                model="fake",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                extra_body=MASK_FIELDS,
            )
            choice = resp.choices[0]
            meta = choice.model_extra["meta_info"]
            masks = meta["output_token_sampling_mask"]
            assert len(masks) == meta["output_token_sampling_mask_length"] == 4
            assert len(meta["output_token_sampling_logprobs"]) == 4
            assert all(t in m for t, m in zip(choice.model_extra["token_ids"], masks, strict=True))

            # A policy rejection surfaces as the SDK's typed error, with the code.
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(
                    model="fake",
                    messages=[{"role": "user", "content": "hi"}],
                    extra_body={**MASK_FIELDS, "top_k": -1},
                )
            assert info.value.code == "sampling_mask_full_vocabulary"

            # Plain traffic through the same client goes to the general pool.
            await client.completions.create(model="fake", prompt="x", max_tokens=2)
            models = await client.models.list()
            assert [m.id for m in models.data] == ["fake-model"]
        finally:
            await client.close()
    sent = mask.requests[0].json()
    assert (sent["top_k"], sent["temperature"], sent["top_p"], sent["min_p"]) == (20, 1.0, 1.0, 0.0)
    assert len(mask.requests) == 1
    assert [r.path for r in general.requests] == ["/v1/completions", "/v1/models"]

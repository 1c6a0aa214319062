"""Calls the in-process worker tests make: a JSON POST (its status and body, or the body of a
200), and the greedy continuation that shows which weights serve."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


async def post(client: TestClient, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
    r = await client.post(path, json=body, **kw)
    return r.status, (await r.json()) if r.content_type == "application/json" else await r.text()


async def post_ok(client: TestClient, path: str, body: Any) -> Any:
    """The JSON body of a POST that must answer 200."""
    status, out = await post(client, path, body)
    assert status == 200, out
    return out


async def greedy(client: TestClient) -> list[int]:
    status, out = await post(
        client, "/generate", {"input_ids": [3, 4, 5], "sampling_params": GREEDY}
    )
    assert status == 200, out
    return out["output_ids"]  # type: ignore[no-any-return]

"""One control call sent to many endpoints at once, and the one answer made of their replies.

A fan-out answer is 200 only when every endpoint succeeded. Otherwise it is an error (never
206, which `raise_for_status` lets through) that still carries SGLang's `success`/`message`
and lists each endpoint's result, so a trainer sees which ones failed and why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from maskgate.gateway.state import GatewayState
from maskgate.gateway.upstream.client import AnswerTooLarge, ConnectError, UpstreamError, read_whole
from maskgate.protocol.errors import ServerError
from maskgate.protocol.responses import json_response

_MESSAGE_CHARS = 500  # an endpoint's message is cut to this many characters in results


@dataclass
class Reply:
    """One endpoint's answer; `status` None when none came (connect error, timeout)."""

    url: str
    status: int | None
    body: bytes
    error: str | None = None
    reached: bool = True  # False when no connection was made: the endpoint never saw it

    def json(self) -> Any:
        try:
            return orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError:
            return None

    @property
    def ok(self) -> bool:
        """2xx, and not SGLang's `{"success": false}` (its weight updates answer 400 then,
        but a 200 saying false must not count as done either)."""
        if self.status is None or not 200 <= self.status < 300:
            return False
        data = self.json()
        return not (isinstance(data, dict) and data.get("success") is False)

    def message(self) -> str:
        if self.error is not None:
            return self.error
        data = self.json()
        if isinstance(data, dict):
            err = data.get("error")
            msg = data.get("message") or (err.get("message") if isinstance(err, dict) else err)
            if isinstance(msg, str):
                return msg[:_MESSAGE_CHARS]
        return self.body.decode("utf-8", "replace").strip()[:_MESSAGE_CHARS]

    def result(self, **extra: Any) -> dict[str, Any]:
        return {
            "url": self.url,
            "status": self.status,
            "success": self.ok,
            "message": self.message(),
            **extra,
        }


async def call(
    state: GatewayState,
    url: str,
    method: str,
    path: str,
    body: bytes | None,
    timeout_s: float,
) -> Reply:
    """One request to one endpoint, whole answer read, within `timeout_s`. A control call
    (any method but GET) carries `upstream_admin_api_key` (else `upstream_api_key`), as
    SGLang's admin routes take it; a GET is a read, with the traffic's `upstream_api_key`."""
    headers = [("Content-Type", "application/json"), ("Accept", "application/json")]
    cfg = state.config
    key = cfg.upstream_api_key
    if method != "GET" and cfg.upstream_admin_api_key is not None:
        key = cfg.upstream_admin_api_key
    if key is not None:
        headers.append(("Authorization", f"Bearer {key}"))
    try:
        async with asyncio.timeout(timeout_s):
            resp = await state.client().request(
                url, method, path, headers, body, timeout_s=timeout_s
            )
            try:
                data = await read_whole(resp, timeout_s, state.config.max_upstream_answer_bytes)
            except BaseException:
                resp.close()
                raise
            resp.release()
    except TimeoutError:
        return Reply(url, None, b"", f"no answer within {timeout_s:g} s")
    except AnswerTooLarge as e:
        return Reply(url, None, b"", e.message)
    except UpstreamError as e:
        reached = not isinstance(e, ConnectError)
        return Reply(url, None, b"", f"{type(e).__name__}: {e}", reached=reached)
    return Reply(url, resp.status, data)


async def fan_out(
    state: GatewayState,
    urls: Sequence[str],
    method: str,
    path: str,
    body: bytes | Callable[[int, str], bytes | None] | None,
    timeout_s: float,
) -> list[Reply]:
    """The same call to every URL concurrently; `body` may be made per (index, url)."""

    def body_for(i: int, url: str) -> bytes | None:
        return body(i, url) if callable(body) else body

    calls = [
        call(state, url, method, path, body_for(i, url), timeout_s) for i, url in enumerate(urls)
    ]
    return list(await asyncio.gather(*calls))


class FanOutError(ServerError):
    """A control call that did not succeed everywhere: the OpenAI-style error, plus SGLang's
    `success`/`message` and the per-endpoint `endpoints` list."""

    def __init__(
        self, code: str, message: str, results: list[dict[str, Any]], *, status: int = 502
    ) -> None:
        super().__init__(code, message, status=status)
        self.results = results

    def body(self) -> dict[str, Any]:
        return {
            **super().body(),
            "success": False,
            "message": self.message,
            "endpoints": self.results,
        }


def failure_status(results: list[dict[str, Any]]) -> int:
    """400 when every endpoint refused the call itself with a 4xx (the request, or the state
    the endpoints are in, such as a busy cache, was at fault); 502 when the pool is left
    split (some succeeded) or an endpoint gave no answer or failed on its side."""
    counted = [r for r in results if not r.get("skipped")]
    codes = [r["status"] for r in counted]
    refused = all(c is not None and 400 <= c < 500 for c in codes)
    return 400 if counted and refused and not any(r["success"] for r in counted) else 502


def answer(
    what: str,
    code: str,
    results: list[dict[str, Any]],
    ok_body: dict[str, Any] | None = None,
) -> web.Response:
    """200 with `ok_body` (+ `endpoints`) when every endpoint succeeded; raises FanOutError
    otherwise. Endpoints marked `skipped` (out of the pool) do not fail the call."""
    failed = [r for r in results if not r["success"] and not r.get("skipped")]
    if failed:
        names = ", ".join(r["url"] for r in failed)
        raise FanOutError(
            code,
            f"{what} failed on {len(failed)} of {len(results)} endpoints: {names}",
            results,
            status=failure_status(results),
        )
    body = {"success": True, "message": f"{what} succeeded on {len(results)} endpoints"}
    body.update(ok_body or {})
    body["endpoints"] = results
    return json_response(body)

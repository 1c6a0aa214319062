"""SGLang's `/tokenize` and `/detokenize` (also under `/v1/`), in SGLang's shapes.

- tokenize: `{"prompt": str | [str], "add_special_tokens": bool = true}` ->
  `{"tokens": [int] | [[int]], "count": int | [int], "max_model_len": int}`;
- detokenize: `{"tokens": [int] | [[int]], "skip_special_tokens": bool = true}` ->
  `{"text": str | [str]}`.

`model` is accepted and not checked (a worker serves one model). Both run the tokenizer off
the event loop, within the request bounds (bounds.py).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from maskgate.protocol.fields import is_int, json_type
from maskgate.protocol.policy import parse_body
from maskgate.protocol.responses import json_response
from maskgate.worker.server.bounds import check_sequences, encode_texts, off_loop
from maskgate.worker.server.params import invalid
from maskgate.worker.server.state import STATE, WorkerState


async def _body(request: web.Request) -> tuple[WorkerState, dict[str, Any]]:
    state = request.app[STATE].get()
    return state, parse_body(await request.read(), state.config.max_body_bytes)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, True)
    if not isinstance(value, bool):
        raise invalid(name, f"must be a bool, not {json_type(value)}")
    return value


async def handle_tokenize(request: web.Request) -> web.Response:
    state, body = await _body(request)
    prompt = body.get("prompt")
    special = _flag(body, "add_special_tokens")
    if isinstance(prompt, str):
        (ids,) = await encode_texts(state, [prompt], "prompt", add_special_tokens=special)
        return json_response(
            {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}
        )
    if not isinstance(prompt, list) or not all(isinstance(p, str) for p in prompt):
        raise invalid("prompt", "must be a string or a list of strings")
    check_sequences(state, len(prompt), "prompts")
    lists = await encode_texts(state, prompt, "prompt", add_special_tokens=special)
    counts = [len(ids) for ids in lists]
    return json_response({"tokens": lists, "count": counts, "max_model_len": state.max_model_len})


async def handle_detokenize(request: web.Request) -> web.Response:
    state, body = await _body(request)
    tokens = body.get("tokens")
    skip = _flag(body, "skip_special_tokens")
    tok = state.tokenizer
    if isinstance(tokens, list) and tokens and all(isinstance(t, list) for t in tokens):
        check_sequences(state, len(tokens), "token lists")
        lists = [_ids(t, state, f"tokens[{i}]") for i, t in enumerate(tokens)]
        texts = await off_loop(lambda: [tok.decode(ids, skip_special_tokens=skip) for ids in lists])
        return json_response({"text": texts})
    if isinstance(tokens, list):
        ids = _ids(tokens, state, "tokens")
        text = await off_loop(lambda: tok.decode(ids, skip_special_tokens=skip)) if ids else ""
        return json_response({"text": text})
    raise invalid("tokens", "must be a list of token ids or a list of such lists")


def _ids(value: list[Any], state: WorkerState, param: str) -> list[int]:
    vocab = state.vocab_size
    if not all(is_int(i) and 0 <= i < vocab for i in value):
        raise invalid(param, f"must hold token ids in [0, {vocab})")
    return value

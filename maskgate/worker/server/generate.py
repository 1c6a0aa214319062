"""SGLang's native `POST /generate`: text or input_ids, single or batch, optional streaming.

Response per sequence: `{"text", "output_ids", "meta_info"}`; a single prompt with n=1 answers
one object, anything else a list (item-major: item 0's n choices, then item 1's, ...).
Streams send one SSE chunk per sequence per engine step, cumulative by default (as SGLang
does) or deltas with `incremental_streaming_output`, then `data: [DONE]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from maskgate.protocol.fields import json_type
from maskgate.protocol.mask_format import mask_formats
from maskgate.protocol.policy import Route
from maskgate.worker.engine.engine import RequestHandle
from maskgate.worker.engine.sequence import Sequence
from maskgate.worker.server.bounds import (
    check_prompt_logprob_rows,
    check_sequences,
    encode_texts,
)
from maskgate.worker.server.inflight import duplicate
from maskgate.worker.server.logprob_params import LogprobOptions, parse_generate_logprobs
from maskgate.worker.server.output import (
    SSE_DONE,
    SeqOutput,
    collect,
    follow,
    holdback,
    open_stream,
    sse,
)
from maskgate.worker.server.params import (
    GenParams,
    invalid,
    opt_bool,
    parse_generate_params,
    per_item,
    unsupported,
)
from maskgate.worker.server.state import WorkerState, admit, check_prompt, request_id
from maskgate.worker.server.top_p_ids import check_payload

_KNOWN = frozenset(
    {
        "text",
        "input_ids",
        "sampling_params",
        "return_sampling_mask",
        "sampling_mask_mode",
        "sampling_mask_format",
        "stream",
        "incremental_streaming_output",
        "rid",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "return_text_in_logprobs",
        "token_ids_logprob",
    }
)


@dataclass(frozen=True, slots=True)
class Item:
    prompt_ids: list[int]
    params: GenParams
    want_mask: bool
    rid: str
    logprobs: LogprobOptions | None = None
    packed: bool = False  # sampling_mask_format "packed"


async def handle_generate(request: web.Request) -> web.StreamResponse:
    state, body, _ = await admit(request, Route.GENERATE)
    items, is_batch = await parse_request(body, state, request_id(request))
    bounded = body.get("sampling_mask_mode") == "bounded"
    seqs: list[Sequence] = []
    outs: list[SeqOutput] = []
    for item in items:
        lp = item.logprobs
        for j in range(item.params.n):
            rid = item.rid if item.params.n == 1 else f"{item.rid}-{j}"
            seqs.append(
                Sequence(
                    rid=rid,
                    prompt_ids=item.prompt_ids,
                    params=item.params.choice_params(j),
                    rule=item.params.rule,
                    want_mask=item.want_mask or item.params.top_p_ids,
                    bounded=bounded and item.want_mask,
                    want_logprob=lp is not None,
                    top_logprobs=lp.top if lp is not None else 0,
                    logprob_start=lp.start if lp is not None else -1,
                    logprob_ids=lp.ids if lp is not None else (),
                )
            )
            outs.append(
                SeqOutput(
                    rid,
                    len(item.prompt_ids),
                    item.want_mask,
                    bounded,
                    holdback=holdback(item.params.rule.stop),
                    packed=item.packed,
                    lp=lp,
                    scored=item.prompt_ids[lp.start :] if lp is not None and lp.start >= 0 else [],
                    admitted_version=state.engine.weight_version,
                    top_p_ids=item.params.top_p_ids,
                )
            )
    many = is_batch or len(seqs) > 1
    # The request's own rid (a batch's base), its items' and its sequences'.
    base = [body["rid"]] if is_batch and isinstance(body.get("rid"), str) else []
    names = {*base, *(item.rid for item in items), *(s.rid for s in seqs)}
    with state.rids.claim(names):
        handle = state.engine.submit(seqs)
        try:
            if opt_bool(body, "stream"):
                incremental = opt_bool(body, "incremental_streaming_output")
                if incremental is None:
                    incremental = state.config.incremental_streaming_output
                return await _stream(
                    request, state, handle, outs, many=many, incremental=incremental
                )
            await collect(request, handle, outs)
        finally:
            handle.abort()
    results = [_result(state, out) for out in outs]
    return web.json_response(results if many else results[0], dumps=_dumps)


async def parse_request(
    body: dict[str, Any], state: WorkerState, default_rid: str
) -> tuple[list[Item], bool]:
    """Validate the body; one Item per prompt. Raises ApiError (400/413) on any bad field or
    bound (bounds.py), all checked before the prompts are tokenized (off the event loop)."""
    for name, value in body.items():
        if name in _KNOWN or value in (None, False, [], {}, ""):
            continue
        raise unsupported(name, f"the field {name!r}")
    raw, is_batch = _raw_prompts(body)
    size = len(raw)
    params = per_item(body.get("sampling_params"), size, is_batch, "sampling_params")
    parsed = [
        parse_generate_params(sp, f"sampling_params[{i}]" if size > 1 else "sampling_params")
        for i, sp in enumerate(params)
    ]
    check_sequences(state, sum(gp.n for gp in parsed))
    flags = per_item(body.get("return_sampling_mask"), size, is_batch, "return_sampling_mask")
    mode = body.get("sampling_mask_mode")
    if mode not in (None, "exact", "bounded"):
        raise invalid("sampling_mask_mode", f"must be 'exact' or 'bounded', got {mode!r}")
    packed = mask_formats(body, size if is_batch else None)
    opt_bool(body, "stream")
    opt_bool(body, "incremental_streaming_output")
    rids = _rids(body.get("rid"), size, is_batch, default_rid)
    check_payload(parsed, state.policy)
    prompts = await _prompts(raw, is_batch, state)
    logprobs = parse_generate_logprobs(
        body,
        [len(p) for p in prompts],
        is_batch,
        state.vocab_size,
        max_top=state.config.max_top_logprobs_num,
    )
    check_prompt_logprob_rows(
        state,
        sum(
            gp.n * (len(p) - lp.start)
            for p, gp, lp in zip(prompts, parsed, logprobs, strict=True)
            if lp is not None and lp.start >= 0
        ),
    )
    items = []
    rows = zip(prompts, parsed, flags, rids, logprobs, packed, strict=True)
    for ids, gp, flag, rid, lp, pk in rows:
        if flag not in (None, True, False):
            raise invalid("return_sampling_mask", f"must be a bool, not {json_type(flag)}")
        items.append(Item(ids, gp, bool(flag), rid, lp, pk))
    return items, is_batch


def _raw_prompts(body: dict[str, Any]) -> tuple[list[str] | list[Any], bool]:
    """The prompts as sent (strings, or id lists), type-checked, not yet tokenized."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise invalid("text", "or input_ids: send exactly one of them")
    if isinstance(text, str):
        return [text], False
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return text, True
    if text is not None:
        raise invalid("text", "must be a string or a non-empty list of strings")
    if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
        return ids, True
    if isinstance(ids, list):
        return [ids], False
    raise invalid("input_ids", "must be a list of token ids or a non-empty list of such lists")


async def _prompts(raw: list[Any], is_batch: bool, state: WorkerState) -> list[list[int]]:
    key = "text" if isinstance(raw[0], str) else "input_ids"
    names = [f"{key}[{i}]" if is_batch else key for i in range(len(raw))]
    if key == "text":
        raw = await encode_texts(state, raw, key)
    return [check_prompt(ids, state, name) for ids, name in zip(raw, names, strict=True)]


def _rids(value: Any, size: int, is_batch: bool, default: str) -> list[str]:
    if value is None:
        value = default
    if isinstance(value, str):
        return [value] if not is_batch else [f"{value}-{i}" for i in range(size)]
    if (
        is_batch
        and isinstance(value, list)
        and len(value) == size
        and all(isinstance(v, str) for v in value)
    ):
        seen: set[str] = set()
        for v in value:
            if v in seen:
                raise duplicate(v)
            seen.add(v)
        return value
    raise invalid("rid", "must be a string (or, for a batch, a list of one string per prompt)")


def _result(state: WorkerState, out: SeqOutput) -> dict[str, Any]:
    tok = state.tokenizer
    return {"text": out.text(tok), "output_ids": out.ids, "meta_info": out.meta_info(tok=tok)}


async def _stream(
    request: web.Request,
    state: WorkerState,
    handle: RequestHandle,
    outs: list[SeqOutput],
    *,
    many: bool,
    incremental: bool,
) -> web.StreamResponse:
    resp: web.StreamResponse | None = None
    sent_ids = [0] * len(outs)  # incremental mode: what each sequence already sent
    sent_chars = [0] * len(outs)
    async for ev in follow(request, handle):
        out = outs[ev.index]
        out.apply(ev)
        if out.error is not None:
            if resp is None:  # nothing sent yet: a proper error status
                raise out.error
            await resp.write(sse(out.error.body()))
            return resp
        if resp is None:
            resp = await open_stream(request)
        text = out.stream_text(state.tokenizer)
        k = ev.index
        chunk: dict[str, Any]
        if incremental:
            chunk = {
                "text": text[sent_chars[k] :],
                "output_ids": out.ids[sent_ids[k] :],
                "meta_info": out.meta_info(since=sent_ids[k], tok=state.tokenizer, stream=True),
            }
            sent_ids[k], sent_chars[k] = len(out.ids), len(text)
        else:
            chunk = {
                "text": text,
                "output_ids": out.ids,
                "meta_info": out.meta_info(tok=state.tokenizer, stream=True),
            }
        if many:
            chunk["index"] = k
        await resp.write(sse(chunk))
    if resp is None:
        resp = await open_stream(request)
    await resp.write(SSE_DONE)
    return resp


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()

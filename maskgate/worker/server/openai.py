"""OpenAI-compatible `POST /v1/chat/completions` and `POST /v1/completions`.

Extensions (as SGLang): top_k, min_p, stop_token_ids, ignore_eos, return_sampling_mask,
sampling_mask_mode, return_meta_info (-> choices[i].meta_info) and return_token_ids
(-> choices[i].token_ids). Mask requests never stream (policy rule 5); other requests may,
as SSE chunks ending in `data: [DONE]`. The `model` field is not checked (as in SGLang):
a worker serves one model and answers with its name.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web

from maskgate.protocol.errors import ApiError
from maskgate.protocol.mask_format import mask_formats
from maskgate.protocol.policy import Route
from maskgate.worker.engine.engine import RequestHandle
from maskgate.worker.engine.sequence import Sequence
from maskgate.worker.server.bounds import (
    check_prompt_bytes,
    check_sequences,
    encode_texts,
    off_loop,
)
from maskgate.worker.server.logprob_format import chat_logprobs, completion_logprobs
from maskgate.worker.server.logprob_params import parse_openai_logprobs
from maskgate.worker.server.output import (
    SSE_DONE,
    SeqOutput,
    collect,
    follow,
    holdback,
    open_stream,
    sse,
)
from maskgate.worker.server.params import GenParams, invalid, opt_bool, parse_openai_params
from maskgate.worker.server.state import WorkerState, admit, check_prompt, request_id

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


async def handle_chat(request: web.Request) -> web.StreamResponse:
    state, body, masked = await admit(request, Route.CHAT)
    messages = _chat_messages(body, state)
    check_prompt_bytes(state, [m["content"] for m in messages], "messages")
    prompt = check_prompt(await off_loop(lambda: _chat_prompt(messages, state)), state, "messages")
    params = parse_openai_params(body, state.max_model_len - len(prompt))
    check_sequences(state, params.n)
    return await _serve(request, state, body, Route.CHAT, [prompt], params, masked)


async def handle_completions(request: web.Request) -> web.StreamResponse:
    state, body, masked = await admit(request, Route.COMPLETIONS)
    params = parse_openai_params(body, COMPLETIONS_DEFAULT_MAX_TOKENS, echo=True)
    prompts = await _completion_prompts(body, state, params.n)
    echo = _echo_texts(body, prompts, state) if opt_bool(body, "echo") else None
    route = Route.COMPLETIONS
    return await _serve(request, state, body, route, prompts, params, masked, echo=echo)


def _chat_messages(body: dict[str, Any], state: WorkerState) -> list[dict[str, str]]:
    """The messages as {role, content} strings, checked before any template runs."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty list of {role, content} objects")
    flat = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise invalid(f"messages[{i}]", "must be an object with a string role")
        flat.append({"role": msg["role"], "content": _content_text(msg.get("content"), i)})
    if getattr(state.tokenizer, "chat_template", None) is None:
        raise ApiError(
            "chat_template_missing",
            f"model {state.model_name!r} has no chat template; use /v1/completions",
            param="messages",
        )
    return flat


def _chat_prompt(flat: list[dict[str, str]], state: WorkerState) -> list[int]:
    """Template and tokenizer: run off the event loop."""
    tok: Any = state.tokenizer
    text = tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
    # The template already holds BOS and role markers; encoding must not add them twice.
    return list(tok.encode(text, add_special_tokens=False))


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise invalid(f"messages[{i}].content", "supports only text parts")
            if not isinstance(part.get("text"), str):
                raise invalid(f"messages[{i}].content", "text parts need a string text")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid(f"messages[{i}].content", "must be a string or a list of text parts")


async def _completion_prompts(body: dict[str, Any], state: WorkerState, n: int) -> list[list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        check_sequences(state, n)
        (ids,) = await encode_texts(state, [prompt], "prompt")
        return [check_prompt(ids, state, "prompt")]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            check_sequences(state, len(prompt) * n)
            lists = await encode_texts(state, prompt, "prompt")
            return [check_prompt(p, state, f"prompt[{i}]") for i, p in enumerate(lists)]
        if all(isinstance(p, list) for p in prompt):
            check_sequences(state, len(prompt) * n)
            return [check_prompt(p, state, f"prompt[{i}]") for i, p in enumerate(prompt)]
        check_sequences(state, n)
        return [check_prompt(prompt, state, "prompt")]
    raise invalid("prompt", "must be a string, a list of strings, or token ids")


def _echo_texts(body: dict[str, Any], prompts: list[list[int]], state: WorkerState) -> list[str]:
    """Completions `echo`: each prompt's text as sent (token-id prompts decoded), prepended
    to its choices' text, as OpenAI and SGLang do."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [state.tokenizer.decode(ids, skip_special_tokens=True) for ids in prompts]


async def _serve(
    request: web.Request,
    state: WorkerState,
    body: dict[str, Any],
    route: Route,
    prompts: list[list[int]],
    params: GenParams,
    masked: bool,
    *,
    echo: list[str] | None = None,
) -> web.StreamResponse:
    stream = bool(opt_bool(body, "stream"))
    meta = bool(opt_bool(body, "return_meta_info"))
    token_ids = bool(opt_bool(body, "return_token_ids"))
    bounded = masked and body.get("sampling_mask_mode") == "bounded"
    packed = mask_formats(body, None)[0]
    lp = parse_openai_logprobs(body, chat=route is Route.CHAT)
    if lp is not None and echo is not None:  # the prompt's log-probs come first
        lp = replace(lp, start=0)
    rid = request_id(request)
    seqs: list[Sequence] = []
    outs: list[SeqOutput] = []
    for p, ids in enumerate(prompts):
        for j in range(params.n):
            k = p * params.n + j
            seq = Sequence(f"{rid}-{k}", ids, params.choice_params(j), params.rule)
            seq.want_mask, seq.bounded = masked, bounded
            if lp is not None:
                seq.want_logprob, seq.top_logprobs, seq.logprob_start = True, lp.top, lp.start
            seqs.append(seq)
            hold = holdback(params.rule.stop)
            out = SeqOutput(f"{rid}-{k}", len(ids), masked, bounded, hold, packed, lp=lp)
            out.scored = ids if lp is not None and lp.start == 0 else []
            out.admitted_version = state.engine.weight_version
            outs.append(out)
    total = sum(len(p) for p in prompts)
    reply = _Reply(
        state, route, rid, outs, prompt_tokens=total, meta=meta, token_ids=token_ids, n=params.n
    )
    reply.echo = echo
    with state.rids.claim([rid, *(s.rid for s in seqs)]):
        handle = state.engine.submit(seqs)
        try:
            if stream:
                return await _stream(request, handle, reply, body)
            await collect(request, handle, outs)
        finally:
            handle.abort()
    return web.json_response(reply.full(), dumps=lambda o: orjson.dumps(o).decode())


class _Reply:
    """Builds the OpenAI response objects (whole, or SSE chunks) for one request."""

    def __init__(
        self,
        state: WorkerState,
        route: Route,
        rid: str,
        outs: list[SeqOutput],
        *,
        prompt_tokens: int,
        meta: bool,
        token_ids: bool,
        n: int = 1,
    ) -> None:
        self.state, self.outs = state, outs
        self.chat = route is Route.CHAT
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + rid
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens  # each prompt once, whatever n is (as OpenAI)
        self.meta, self.token_ids = meta, token_ids
        self.echo: list[str] | None = None  # completions echo: each prompt's text
        self.n = n  # choices per prompt (outs hold each prompt's n choices in a row)

    def envelope(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind + (".chunk" if chunk and self.chat else ""),
            "created": self.created,
            "model": self.state.model_name,
        }

    def usage(self) -> dict[str, Any]:
        completion = sum(len(o.ids) for o in self.outs)
        # Each prompt counts once (as prompt_tokens does): the tokens of it that none of its
        # n choices computed.
        groups = [self.outs[i : i + self.n] for i in range(0, len(self.outs), self.n)]
        cached = sum(min(o.cached_tokens for o in g) for g in groups)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def choice(
        self, k: int, text: str, ids: list[int], *, delta: bool = False, since: int = 0
    ) -> dict[str, Any]:
        """Choice k; `ids` are its output ids from index `since` on (a stream's new ones), and
        `text` the piece of text they add."""
        out = self.outs[k]
        c: dict[str, Any] = {"index": k}
        if self.chat:
            c["delta" if delta else "message"] = (
                {"content": text} if delta else {"role": "assistant", "content": text}
            )
        else:  # a choice's first piece starts with its prompt under echo
            c["text"] = text if self.echo is None or since else self.echo[k // self.n] + text
        c["logprobs"] = self.logprobs(k, since, len(ids)) if out.lp is not None else None
        c["finish_reason"] = out.openai_finish_reason()
        c["matched_stop"] = out.matched_stop
        if self.meta and not delta:
            c["meta_info"] = out.meta_info(tok=self.state.tokenizer)
        if self.token_ids:
            c["token_ids"] = ids
        return c

    def logprobs(self, k: int, since: int, count: int) -> dict[str, Any]:
        """choices[k].logprobs of output tokens since .. since + count."""
        out = self.outs[k]
        assert out.lp is not None
        end = since + count
        tops = out.top[since:end] if out.lp.top > 0 else None
        tok = self.state.tokenizer
        if self.chat:
            return chat_logprobs(out.raw_logprobs[since:end], out.ids[since:end], tops, tok)
        values: list[float | None] = list(out.raw_logprobs[since:end])
        ids = out.ids[since:end]
        # Where this piece starts in the choice's text: the decoded tokens before it.
        offset = len(tok.decode(out.ids[:since], skip_special_tokens=True)) if since else 0
        if self.echo is not None and since:  # after the echoed prompt
            offset += len(self.echo[k // self.n])
        elif self.echo is not None:  # the prompt's tokens first; its first has no log-prob
            values = [None, *out.input_logprobs, *values]
            ids = [*out.scored, *ids]
            if tops is not None:
                return completion_logprobs(values, ids, [None, *out.input_top, *tops], tok)
        return completion_logprobs(values, ids, tops, tok, offset)

    def full(self) -> dict[str, Any]:
        tok = self.state.tokenizer
        choices = [self.choice(k, o.text(tok), o.ids) for k, o in enumerate(self.outs)]
        full = {**self.envelope(False), "choices": choices, "usage": self.usage()}
        full.update(versions(self.outs[0]))
        return full

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {**self.envelope(True), "choices": choices}


async def _stream(
    request: web.Request, handle: RequestHandle, reply: _Reply, body: dict[str, Any]
) -> web.StreamResponse:
    """Non-mask requests only (policy rule 5). One chunk per choice per engine step."""
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise invalid("stream_options", "must be an object")
    include_usage = bool(opts and opt_bool(opts, "include_usage", "stream_options."))
    tok = reply.state.tokenizer
    resp = await open_stream(request)
    if reply.chat:  # the role arrives first, one chunk per choice, as OpenAI sends it
        for k in range(len(reply.outs)):
            role = {"index": k, "delta": {"role": "assistant", "content": ""}}
            await resp.write(sse(reply.chunk([{**role, "finish_reason": None}])))
    sent_ids = [0] * len(reply.outs)
    sent_chars = [0] * len(reply.outs)
    async for ev in follow(request, handle):
        k = ev.index
        out = reply.outs[k]
        out.apply(ev)
        if out.error is not None:
            await resp.write(sse(out.error.body()))
            return resp
        text = out.stream_text(tok)
        piece, ids = text[sent_chars[k] :], out.ids[sent_ids[k] :]
        if not piece and not out.finished and not reply.token_ids:
            continue  # an incomplete character: wait for the next token
        choice = reply.choice(k, piece, ids, delta=True, since=sent_ids[k])
        sent_chars[k], sent_ids[k] = max(len(text), sent_chars[k]), len(out.ids)
        chunk = reply.chunk([choice])
        if out.finished:  # a choice's last chunk: the weights that produced it
            chunk.update(versions(out))
        await resp.write(sse(chunk))
    if include_usage:
        await resp.write(sse({**reply.chunk([]), "usage": reply.usage()}))
    await resp.write(SSE_DONE)
    return resp


def versions(out: SeqOutput) -> dict[str, Any]:
    """The weight versions of a choice, at the top level of an answer: `metadata` (a flat
    string map, as OpenAI defines it) holds the version of its last token's weights, and
    `sglext`, as SGLang's answers, that version and its spans."""
    spans = out.spans()
    version = spans[-1]["version"]
    return {
        "metadata": {"weight_version": version},
        "sglext": {"weight_version": version, "weight_versions": spans},
    }

"""Per-sequence output as the handlers see it: events accumulate here, responses read it.

Also the pieces every endpoint shares: following a request's events while watching for a
client that went away, SSE framing, and the `meta_info` mask fields.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import web

from maskgate.protocol.errors import ApiError
from maskgate.worker.engine.batch import MaskIds
from maskgate.worker.engine.engine import Event, RequestHandle
from maskgate.worker.server.logprob_format import Top, token_texts, top_triples, triples
from maskgate.worker.server.logprob_params import LogprobOptions
from maskgate.worker.server.mask_fields import mask_fields
from maskgate.worker.server.top_p_ids import add_top_p_info

DISCONNECT_POLL_S = 0.5  # how often a waiting handler checks that its client is still there
REPLACEMENT_CHAR = "\ufffd"  # a token that ends inside a multi-byte character decodes to this


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class ClientGone(Exception):
    """The client closed the connection; the request was aborted."""


@dataclass(slots=True)
class SeqOutput:
    rid: str
    prompt_tokens: int
    want_mask: bool
    bounded: bool
    # Streams hold back this many trailing characters (longest stop string - 1), so text
    # that may turn out to start a stop string is never sent before the match is known.
    holdback: int = 0
    packed: bool = False  # sampling_mask_format "packed" (protocol/mask_format.py)
    start: float = field(default_factory=time.monotonic)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    masks: list[MaskIds] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    # Raw-distribution log-probs (return_logprob); `scored` is the prompt from
    # lp.start on (its first token has no log-prob), empty when lp.start is -1.
    lp: LogprobOptions | None = None
    scored: list[int] = field(default_factory=list)
    raw_logprobs: list[float] = field(default_factory=list)
    top: list[Top] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    input_top: list[Top] = field(default_factory=list)
    ids_logprobs: list[list[float]] = field(default_factory=list)  # token_ids_logprob
    input_ids_logprobs: list[list[float]] = field(default_factory=list)
    texts: dict[int, str] = field(default_factory=dict)  # token id -> text, decoded once
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    text_limit: int | None = None
    error: ApiError | None = None
    abort_message: str | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # Weight versions over output positions: [{"version", "start", "end"}], end exclusive.
    weight_versions: list[dict[str, Any]] = field(default_factory=list)
    weight_version: str | None = None  # the engine's version at the latest event
    admitted_version: str | None = None  # the engine's version when the request was admitted
    top_p_ids: bool = False  # custom_params.return_top_p_token_ids (server/top_p_ids.py)
    spans_sent: dict[int, int] = field(default_factory=dict)  # streams: span start -> end sent
    # Incremental detokenization for streams (token offsets into `ids`).
    streamed: str = ""
    prefix_offset: int = 0
    read_offset: int = 0

    def apply(self, ev: Event) -> None:
        if ev.weight_version is not None:
            self.weight_version = ev.weight_version
        self.cached_tokens = ev.cached_tokens
        if ev.token is not None:
            self.ids.append(ev.token)
            spans = self.weight_versions
            if spans and spans[-1]["version"] == ev.weight_version:
                spans[-1]["end"] += 1
            else:
                n = len(self.ids)
                spans.append({"version": ev.weight_version, "start": n - 1, "end": n})
            if self.want_mask or self.top_p_ids:
                assert ev.mask is not None and ev.logprob is not None
                self.masks.append(ev.mask)
                self.logprobs.append(ev.logprob)
                self.truncated.append(ev.truncated)
            if self.lp is not None:
                assert ev.raw_logprob is not None
                self.raw_logprobs.append(ev.raw_logprob)
                if self.lp.top > 0:
                    self.top.append(ev.top or [])
                if self.lp.ids:
                    self.ids_logprobs.append(ev.ids_logprobs or [])
        if ev.input_logprobs is not None:
            self.input_logprobs = ev.input_logprobs
            self.input_top = ev.input_top or []
            self.input_ids_logprobs = ev.input_ids_logprobs or []
        if ev.finished:
            self.finish_reason = ev.finish_reason
            self.matched_stop = ev.matched_stop
            self.text_limit = ev.text_limit
            self.error = ev.error
            self.abort_message = ev.abort_message

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def text(self, tok: Tokenizer) -> str:
        """The decoded output, cut before a matched stop string."""
        text = tok.decode(self.ids, skip_special_tokens=True)
        return text if self.text_limit is None else text[: self.text_limit]

    def stream_text(self, tok: Tokenizer) -> str:
        """The output decoded so far, for streams: each call decodes only the newest tokens
        (a full decode per step would make a stream O(n^2)); a trailing incomplete character
        waits for its next token. Once finished, the exact `text`."""
        if self.finished:
            return self.text(tok)
        if len(self.ids) > self.read_offset:
            done = tok.decode(
                self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True
            )
            now = tok.decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
            if len(now) > len(done) and not now.endswith(REPLACEMENT_CHAR):
                self.streamed += now[len(done) :]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self.streamed[: max(0, len(self.streamed) - self.holdback)]

    def openai_finish_reason(self) -> str | None:
        if self.finish_reason in ("stop", "length"):
            return self.finish_reason
        return "abort" if self.finish_reason == "abort" else None

    def meta_info(
        self, *, since: int = 0, tok: Tokenizer | None = None, stream: bool = False
    ) -> dict[str, Any]:
        """SGLang-style meta_info; mask and log-prob fields from output index `since` on
        (prompt log-probs only with since=0). `tok` decodes return_text_in_logprobs.
        `stream`: a stream chunk, whose weight_versions are the spans new since the last."""
        spans = self.spans()
        info: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.sglang_finish_reason(),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.ids),
            "cached_tokens": self.cached_tokens,
            "e2e_latency": round(time.monotonic() - self.start, 6),
            # The version of the last token's weights (before any token, the admitted one).
            "weight_version": spans[-1]["version"],
            "weight_versions": self.stream_spans(spans) if stream else spans,
        }
        if self.want_mask:
            info.update(
                mask_fields(
                    self.masks[since:],
                    self.logprobs[since:],
                    self.truncated[since:],
                    bounded=self.bounded,
                    packed=self.packed,
                )
            )
        if self.lp is not None:
            info.update(self.logprob_info(since, tok))
        if self.top_p_ids:
            add_top_p_info(info, self.masks, self.finished)
        return info

    def spans(self) -> list[dict[str, Any]]:
        """`weight_versions`, never empty: a sequence that has no token yet (or was aborted
        before its first) holds one empty span of the version it was admitted under."""
        if self.weight_versions:
            return self.weight_versions
        version = self.admitted_version or self.weight_version
        return [{"version": version, "start": 0, "end": 0}]

    def stream_spans(self, spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A stream chunk's spans: those that began or grew since this sequence's previous
        chunk (usually the current one alone); the final chunk holds the whole list."""
        if self.finished:
            return spans
        new = [dict(s) for s in spans if self.spans_sent.get(s["start"]) != s["end"]]
        for s in new:
            self.spans_sent[s["start"]] = s["end"]
        return new  # copies: the last span keeps growing after the chunk is built

    def logprob_info(self, since: int, tok: Tokenizer | None) -> dict[str, Any]:
        """SGLang's return_logprob fields of meta_info."""
        assert self.lp is not None
        text = token_texts(tok, self.texts) if self.lp.text and tok is not None else None
        # The prompt's scored positions that have log-probs so far (all once prefilled).
        prompt = [None, *self.input_logprobs] if since == 0 and self.scored else []
        ids = self.scored[: len(prompt)]
        # Rows returning top-p ids report the log-prob over those ids (the distribution the
        # token was drawn from), as slime's SGLang does; the others the raw one.
        values = self.logprobs if self.top_p_ids else self.raw_logprobs
        info: dict[str, Any] = {
            "input_token_logprobs": triples(prompt, ids, text),
            "output_token_logprobs": triples(values[since:], self.ids[since:], text),
            "output_token_logprobs_length": len(self.ids) - since,
        }
        if self.lp.top > 0:
            tops: list[Top | None] = [None, *self.input_top][: len(prompt)]
            info["input_top_logprobs"] = top_triples(tops, text)
            info["output_top_logprobs"] = top_triples(self.top[since:], text)
        if self.lp.ids:
            info.update(self.ids_logprob_info(len(prompt), since, text))
        return info

    def ids_logprob_info(
        self, num_prompt: int, since: int, text: Callable[[int], str] | None
    ) -> dict[str, Any]:
        """SGLang's token_ids_logprob fields: per position, one triple per asked id (in the
        asked order); the prompt's first position, which nothing scores, is null."""
        assert self.lp is not None
        ids = self.lp.ids
        prompt = [None, *(list(zip(v, ids, strict=True)) for v in self.input_ids_logprobs)]
        output = [list(zip(v, ids, strict=True)) for v in self.ids_logprobs[since:]]
        return {
            "input_token_ids_logprobs": top_triples(prompt[:num_prompt], text),
            "output_token_ids_logprobs": top_triples(output, text),
        }

    def sglang_finish_reason(self) -> dict[str, Any] | None:
        if self.finish_reason == "stop":
            return {"type": "stop", "matched": self.matched_stop}
        if self.finish_reason == "length":
            return {"type": "length", "length": len(self.ids)}
        if self.finish_reason == "abort":
            return {"type": "abort", "message": self.abort_message or "aborted"}
        return None


def holdback(stops: tuple[str, ...]) -> int:
    return max((len(s) for s in stops), default=1) - 1


async def follow(request: web.Request, handle: RequestHandle) -> AsyncIterator[Event]:
    """The request's events until every sequence finished. Raises ClientGone when the
    client disconnects; the caller aborts the handle in a `finally`."""
    checked = time.monotonic()
    while handle.num_open:
        ev = await handle.next_event(DISCONNECT_POLL_S)
        if ev is not None:
            yield ev
        # Checked while events flow too, not only when they pause: handler cancellation is
        # the fast path, this is the guarantee.
        now = time.monotonic()
        if ev is None or now - checked >= DISCONNECT_POLL_S:
            checked = now
            if request.transport is None or request.transport.is_closing():
                raise ClientGone


async def collect(request: web.Request, handle: RequestHandle, outs: list[SeqOutput]) -> None:
    """Run a non-streaming request to the end; the first failed sequence fails it."""
    async for ev in follow(request, handle):
        out = outs[ev.index]
        out.apply(ev)
        if out.error is not None:
            raise out.error


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    return resp

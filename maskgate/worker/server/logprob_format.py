"""Raw log-probs in the response shapes: SGLang's meta_info triples and OpenAI's objects.

SGLang: each position is a triple `[logprob, token_id, text]` (text null unless
return_text_in_logprobs); top log-probs are one list of triples per position, null where a
position has none (the first prompt token). OpenAI chat: `{"content": [{token, logprob,
bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}`. OpenAI completions:
`{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.

A token's text is the tokenizer's decoding of that one id (special tokens kept); a token
that holds part of a multi-byte character decodes to U+FFFD, and `bytes` are that text's
UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

Top = list[tuple[float, int]]


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def token_texts(tok: Decoder, seen: dict[int, str] | None = None) -> Callable[[int], str]:
    """One id -> its text, memoised in `seen` (a sequence's, so cumulative stream events do
    not decode their tokens again; top lists repeat ids)."""
    if seen is None:
        seen = {}

    def text(i: int) -> str:
        s = seen.get(i)
        if s is None:
            s = seen[i] = tok.decode([i], skip_special_tokens=False)
        return s

    return text


def triples(
    values: Sequence[float | None], ids: Sequence[int], text: Callable[[int], str] | None
) -> list[list[Any]]:
    """SGLang's [logprob, token_id, text|None] per position."""
    if text is None:
        return [[v, i, None] for v, i in zip(values, ids, strict=True)]
    return [[v, i, text(i)] for v, i in zip(values, ids, strict=True)]


def top_triples(
    tops: Sequence[Top | None], text: Callable[[int], str] | None
) -> list[list[list[Any]] | None]:
    """SGLang's top log-probs: per position a list of triples, or None."""
    return [
        None if t is None else triples([v for v, _ in t], [i for _, i in t], text) for t in tops
    ]


def chat_logprobs(
    values: Sequence[float], ids: Sequence[int], tops: Sequence[Top] | None, tok: Decoder
) -> dict[str, Any]:
    """OpenAI chat `choices[i].logprobs`; tops None when top_logprobs was not asked."""
    text = token_texts(tok)

    def entry(v: float, i: int) -> dict[str, Any]:
        s = text(i)
        return {"token": s, "logprob": v, "bytes": list(s.encode("utf-8"))}

    content = []
    for k, (v, i) in enumerate(zip(values, ids, strict=True)):
        e = entry(v, i)
        e["top_logprobs"] = [entry(tv, ti) for tv, ti in tops[k]] if tops is not None else []
        content.append(e)
    return {"content": content, "refusal": None}


def completion_logprobs(
    values: Sequence[float | None],
    ids: Sequence[int],
    tops: Sequence[Top | None] | None,
    tok: Decoder,
    offset: int = 0,
) -> dict[str, Any]:
    """OpenAI completions `choices[i].logprobs`; text_offset counts characters of the
    output from `offset` (where this piece starts in the choice's text). A None value or
    top list (an echoed prompt's first token) answers null."""
    text = token_texts(tok)
    tokens = [text(i) for i in ids]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": list(values),
        "top_logprobs": (
            [None if t is None else {text(i): v for v, i in t} for t in tops]
            if tops is not None
            else None
        ),
        "text_offset": offsets,
    }

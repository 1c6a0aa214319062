"""What the load generator sends: one request body and path per case, and the mask answer
the fixed-response upstream gives to `/generate`.

- `chat`: a small non-mask chat completion (about 110 bytes), the cheapest request.
- `chat2k`: a realistic non-mask chat completion, 1.9 KB (a system prompt and a question).
- `mask2k`: a 2 KB `/generate` mask request (SGLang's native API, `return_sampling_mask`),
  the RL path: the gateway parses it, runs the mask policy, adds its request id and checks
  the mask answer (8 tokens, 20 ids each) on the way back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

_SYSTEM = (
    "You are a careful assistant for a software team. Answer precisely, cite the relevant "
    "function names, and prefer short code examples over long prose. "
) * 8
_QUESTION = "Explain how keep-alive connections between a reverse proxy and its upstreams work."


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: bytes

    def write(self, directory: Path) -> Path:
        """The body as a file, for the wrk script (BENCH_BODY_FILE)."""
        path = directory / f"body_{self.name}.json"
        path.write_bytes(self.body)
        return path


def _chat(content: list[dict[str, str]]) -> bytes:
    return orjson.dumps(
        {"model": "bench-model", "messages": content, "max_tokens": 8, "temperature": 0.7}
    )


def _pad_to(make: callable, size: int) -> bytes:  # type: ignore[valid-type]
    """`make(text)` with `text` grown until the body is `size` bytes."""
    text = ""
    while len(body := make(text)) < size:
        text += "x" * (size - len(body))
    return body


CASES = {
    "chat": Case(
        "chat", "/v1/chat/completions", _chat([{"role": "user", "content": "Say hello."}])
    ),
    "chat2k": Case(
        "chat2k",
        "/v1/chat/completions",
        _pad_to(
            lambda t: _chat(
                [
                    {"role": "system", "content": _SYSTEM + t},
                    {"role": "user", "content": _QUESTION},
                ]
            ),
            1900,
        ),
    ),
    "mask2k": Case(
        "mask2k",
        "/generate",
        _pad_to(
            lambda t: orjson.dumps(
                {
                    "text": _SYSTEM + _QUESTION + t,
                    "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "top_k": 20},
                    "return_sampling_mask": True,
                }
            ),
            2048,
        ),
    ),
}

_TOKENS = 8
_MASKS = [[100 * t + i for i in range(20)] for t in range(_TOKENS)]
# SGLang's /generate answer with the mask fields, as a mask worker returns it.
GENERATE_ANSWER = {
    "text": " Keep-alive connections are reused.",
    "output_ids": [m[3] for m in _MASKS],
    "meta_info": {
        "id": "bench",
        "finish_reason": {"type": "length", "length": _TOKENS},
        "prompt_tokens": 420,
        "completion_tokens": _TOKENS,
        "output_token_sampling_mask": _MASKS,
        "output_token_sampling_logprobs": [-1.25] * _TOKENS,
        "output_token_sampling_mask_length": _TOKENS,
    },
}

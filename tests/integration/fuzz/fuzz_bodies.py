"""Hypothesis strategies for request bodies of the three inference endpoints.

`valid_mask_case` builds mask requests that docs/design.md, Policy admits, by construction
(independently of gateway.policy): typed fields in range, at least one of greedy / finite
top_k / top_p < 1 / min_p > 0, neutral logit transforms, the payload estimate within the
limit. `mutated_mask_case` breaks them one field at a time with hostile values;
`general_case` builds requests that do not ask for masks; `garbage_case` sends bytes that
are not a JSON object, or too many of them.

A case is `(path, raw bytes)`; strategies return raw bytes so that invalid JSON (NaN,
truncation) is reachable.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")

# Must match the gateway config the fuzz tests run with.
CAP = 4096  # policy.max_mask_tokens
MAX_MASK_IDS = 2_000_000  # policy.max_mask_ids_per_request
DEFAULT_MAX_TOKENS = 2048  # policy.default_max_tokens
MAX_BODY_BYTES = 16 * 1024

SAMPLING_NAMES = ("temperature", "top_p", "top_k", "min_p")
TRANSFORM_NAMES = (
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "min_new_tokens",
    "regex",
    "ebnf",
    "json_schema",
    "custom_logit_processor",
)
OPENAI_FLAGS = ("return_sampling_mask", "return_meta_info", "stream", "return_token_ids")
OTHER_NAMES = (
    "n",
    "max_tokens",
    "max_completion_tokens",
    "max_new_tokens",
    "sampling_mask_mode",
    "response_format",
    "sampling_params",
    "text",
    "input_ids",
    "messages",
    "prompt",
    "rid",
    "unknown_field",
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
# Values picked for the boundaries of the policy's checks.
HOSTILE = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            2,
            -2,
            CAP,
            CAP + 1,
            10**6,
            2**31,
            2**63,
            -(2**63),
            2**64,
            0.0,
            -0.0,
            1.0,
            0.5,
            0.99999999,
            0.9999999,
            1.0000001,
            1e-45,
            5e-324,
            -1e-300,
            1e308,
            "20",
            "",
            "true",
            "exact",
            "bounded",
            [],
            {},
            [True],
            [True, False],
            [1, 2],
            {"a": 1},
            {"type": "json_object"},
            float("nan"),
            float("inf"),
        ]
    ),
    json_values,
)

# --- valid by construction ---------------------------------------------------------------


def _number(lo: float, hi: float) -> st.SearchStrategy[float | int]:
    ints = st.integers(int(lo) if lo == int(lo) else int(lo) + 1, int(hi))
    return st.one_of(st.floats(lo, hi), ints) if int(hi) >= lo else st.floats(lo, hi)


@st.composite
def valid_sampling(draw: st.DrawFn) -> dict[str, Any]:
    """Sampling fields that are in range and do not ask for the full vocabulary."""
    out: dict[str, Any] = {}
    narrow = draw(st.sampled_from(["greedy", "top_k", "top_p", "min_p"]))
    if narrow == "greedy":
        out["temperature"] = draw(st.sampled_from([0, 0.0]))
    elif draw(st.booleans()):
        out["temperature"] = draw(st.one_of(st.none(), _number(0, 2)))
    if narrow == "top_k":
        out["top_k"] = draw(st.integers(1, CAP))
    elif draw(st.booleans()):
        out["top_k"] = draw(st.one_of(st.none(), st.sampled_from([-1, 0]), st.integers(1, CAP)))
    if narrow == "top_p":
        out["top_p"] = draw(st.floats(1e-3, 0.999))  # float32 of these is < 1
    elif draw(st.booleans()):
        out["top_p"] = draw(st.one_of(st.none(), st.just(1), st.floats(1e-6, 1.0)))
    if narrow == "min_p":
        out["min_p"] = draw(st.one_of(st.floats(1e-6, 1.0), st.just(1)))
    elif draw(st.booleans()):
        out["min_p"] = draw(st.one_of(st.none(), _number(0, 1)))
    # Neutral logit transforms are allowed.
    neutral: dict[str, st.SearchStrategy[Any]] = {
        "frequency_penalty": st.sampled_from([0, 0.0, None]),
        "presence_penalty": st.sampled_from([0, 0.0, None]),
        "repetition_penalty": st.sampled_from([1, 1.0, None]),
        "logit_bias": st.sampled_from([{}, None]),
        "min_tokens": st.sampled_from([0, None]),
        "regex": st.sampled_from(["", None]),
    }
    for name in draw(st.lists(st.sampled_from(sorted(neutral)), max_size=3, unique=True)):
        out[name] = draw(neutral[name])
    return out


def _per_token(params: dict[str, Any]) -> int:
    k = params.get("top_k")
    return min(k, CAP) if isinstance(k, int) and k > 0 else CAP


@st.composite
def _budget(draw: st.DrawFn, params: dict[str, Any]) -> tuple[int | None, int | None]:
    """(n, max_tokens) with n * max_tokens * per-token ids within the payload limit."""
    n = draw(st.one_of(st.none(), st.integers(1, 4)))
    room = MAX_MASK_IDS // ((n or 1) * _per_token(params))
    if room >= DEFAULT_MAX_TOKENS and draw(st.booleans()):
        return n, None
    return n, draw(st.integers(0, min(room, 256)))


@st.composite
def valid_openai(draw: st.DrawFn, path: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fake", **draw(valid_sampling())}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": draw(st.text(max_size=20))}]
    else:
        body["prompt"] = draw(st.one_of(st.text(max_size=20), st.lists(st.integers(0, 999))))
    body["return_sampling_mask"] = True
    body["return_meta_info"] = True
    n, max_tokens = draw(_budget(body))
    if n is not None:
        body["n"] = n
    if max_tokens is not None:
        field = "max_tokens"
        if path == "/v1/chat/completions" and draw(st.booleans()):
            field = "max_completion_tokens"
        body[field] = max_tokens
    optional = {
        "stream": st.sampled_from([False, None]),
        "return_token_ids": st.one_of(st.none(), st.booleans()),
        "sampling_mask_mode": st.sampled_from(["exact", "bounded", None]),
        "response_format": st.sampled_from([None, {"type": "text"}]),
        "sampling_seed": st.integers(0, 2**31),
        "user": st.text(max_size=5),
        "x_extension": json_values,
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        body[name] = draw(optional[name])
    return body


@st.composite
def _loose_sampling(draw: st.DrawFn) -> dict[str, Any]:
    """Typed and in range (rule 3) but possibly full-vocabulary or transformed: what an
    item of a batch that does not ask for a mask may carry."""
    out = dict(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "temperature": _number(0, 2),
                    "top_p": st.floats(1e-6, 1.0),
                    "top_k": st.integers(-1, 10**6),
                    "min_p": _number(0, 1),
                    "frequency_penalty": _number(-2, 2),
                    "repetition_penalty": _number(0.5, 2),
                    "max_new_tokens": st.integers(0, 10**6),
                    "n": st.integers(1, 100),
                },
            )
        )
    )
    return out


@st.composite
def valid_generate(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.one_of(st.none(), st.integers(1, 4)))  # None: a single request
    body: dict[str, Any] = {}
    if size is None:
        if draw(st.booleans()):
            body["text"] = draw(st.text(max_size=10))
        else:
            body["input_ids"] = draw(st.lists(st.integers(0, 999), max_size=5))
        flags = [True]
    elif draw(st.booleans()):
        body["text"] = draw(st.lists(st.text(max_size=8), min_size=size, max_size=size))
    else:
        body["input_ids"] = draw(
            st.lists(
                st.lists(st.integers(0, 999), min_size=1, max_size=4),
                min_size=size,
                max_size=size,
            )
        )
    if size is not None:
        flags = draw(st.lists(st.booleans(), min_size=size, max_size=size))
        flags[draw(st.integers(0, size - 1))] = True  # at least one item asks for a mask
    shared = size is None or draw(st.booleans())  # one sampling_params for every item
    budget_left = MAX_MASK_IDS
    items: list[dict[str, Any]] = []
    for flag in [True] if shared else flags:
        if not flag:
            items.append(draw(_loose_sampling()))
            continue
        sp = draw(valid_sampling())
        n, max_new = draw(_budget(sp))
        tokens = DEFAULT_MAX_TOKENS if max_new is None else max_new
        copies = sum(flags) if shared else 1  # a shared object counts once per masked item
        cost = (n or 1) * tokens * _per_token(sp) * copies
        if cost > budget_left:  # keep the whole batch within the payload limit
            n, max_new, cost = None, 0, 0
        budget_left -= cost
        if n is not None:
            sp["n"] = n
        if max_new is not None:
            sp["max_new_tokens"] = max_new
        items.append(sp)
    body["sampling_params"] = items[0] if shared else items
    as_list = size is not None and (not all(flags) or draw(st.booleans()))
    body["return_sampling_mask"] = flags if as_list else True
    optional = {
        "stream": st.one_of(st.none(), st.booleans()),
        "sampling_mask_mode": st.sampled_from(["exact", "bounded", None]),
        "rid": st.text(min_size=1, max_size=8)
        if size is None
        else st.just([f"r{i}" for i in range(size)]),
        "return_logprob": st.booleans(),
        "x_extension": json_values,
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=3, unique=True)):
        body[name] = draw(optional[name])
    return body


def encode(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


@st.composite
def valid_mask_case(draw: st.DrawFn) -> tuple[str, bytes, Any]:
    path = draw(st.sampled_from(PATHS))
    body = draw(valid_generate() if path == "/generate" else valid_openai(path))
    return path, encode(body), body


# --- broken on purpose ---------------------------------------------------------------------


@st.composite
def mutated_mask_case(draw: st.DrawFn) -> tuple[str, bytes, Any]:
    """A valid mask request with one to three fields set to hostile values or removed."""
    path, _, body = draw(valid_mask_case())
    for _ in range(draw(st.integers(1, 3))):
        target = body
        sp = body.get("sampling_params")
        if path == "/generate" and draw(st.booleans()):
            if isinstance(sp, dict):
                target = sp
            elif isinstance(sp, list) and sp and all(isinstance(i, dict) for i in sp):
                target = draw(st.sampled_from(sp))
        names = SAMPLING_NAMES + TRANSFORM_NAMES + OPENAI_FLAGS + OTHER_NAMES
        name = draw(st.sampled_from(names))
        if draw(st.integers(0, 4)) == 0:
            target.pop(name, None)
        else:
            # A copy: the sampled constants must never be shared or mutated in place.
            target[name] = copy.deepcopy(draw(HOSTILE))
    return path, encode(body), body


@st.composite
def targeted_break_case(draw: st.DrawFn) -> tuple[str, bytes, Any]:
    """A valid mask request with one rule (3-9) broken on purpose, so that every rejection
    code shows up in a run; the expected answer is still whatever the policy says."""
    path, _, body = draw(valid_mask_case())
    target = body
    sp = body.get("sampling_params")
    if isinstance(sp, dict):
        target = sp
    elif isinstance(sp, list):
        flags = body["return_sampling_mask"]
        target = sp[next(i for i, f in enumerate(flags) if f)] if isinstance(flags, list) else sp[0]
    openai = path != "/generate"
    rules = ["type", "range", "transform", "full_vocabulary", "cap", "payload"]
    rule = draw(st.sampled_from([*rules, "meta_info", "stream"] if openai else rules))
    if rule == "type":
        name = draw(st.sampled_from(SAMPLING_NAMES))
        target[name] = draw(st.sampled_from(["20", True, [0.5], {"v": 1}]))
    elif rule == "range":
        name, value = draw(
            st.sampled_from(
                [
                    ("temperature", -0.5),
                    ("top_p", 0),
                    ("top_p", 1.5),
                    ("min_p", -0.1),
                    ("min_p", 2),
                    ("top_k", -2),
                    ("n", 0),
                    ("max_tokens" if openai else "max_new_tokens", -1),
                ]
            )
        )
        target[name] = value
    elif rule == "transform":
        name, value = draw(
            st.sampled_from(
                [
                    ("frequency_penalty", 0.5),
                    ("presence_penalty", -1),
                    ("repetition_penalty", 1.2),
                    ("logit_bias", {"42": 5}),
                    ("min_tokens", 3),
                    ("regex", "a+"),
                    ("json_schema", {"type": "object"}),
                    ("custom_logit_processor", "x"),
                ]
            )
        )
        target[name] = value
    elif rule == "full_vocabulary":
        target.update(
            temperature=draw(st.sampled_from([None, 0.7, 1])),
            top_k=draw(st.sampled_from([None, -1, 0])),
            top_p=draw(st.sampled_from([None, 1, 1.0, 0.99999999])),
            min_p=None,
        )
    elif rule == "cap":
        target["top_k"] = draw(st.integers(CAP + 1, 10**6))
    elif rule == "payload":
        target.update(top_k=CAP, n=draw(st.integers(1, 8)))
        target["max_tokens" if openai else "max_new_tokens"] = draw(st.integers(10**3, 10**6))
    elif rule == "meta_info":
        body["return_meta_info"] = draw(st.sampled_from([False, None]))
    else:
        body["stream"] = True
    return path, encode(body), body


@st.composite
def general_case(draw: st.DrawFn) -> tuple[str, bytes, Any]:
    """A JSON object that does not ask for a mask: anything goes, and it is forwarded."""
    path = draw(st.sampled_from(PATHS))
    keys = st.one_of(
        st.sampled_from(SAMPLING_NAMES + TRANSFORM_NAMES + OTHER_NAMES), st.text(max_size=8)
    )
    body = draw(st.dictionaries(keys, json_values, max_size=6))
    body.pop("return_sampling_mask", None)
    off = draw(st.sampled_from(["absent", None, False, "list"]))
    if off == "list":
        body["return_sampling_mask"] = draw(st.lists(st.sampled_from([False, None]), max_size=3))
    elif off != "absent":
        body["return_sampling_mask"] = off
    return path, encode(body), body


@st.composite
def garbage_case(draw: st.DrawFn) -> tuple[str, bytes, Any]:
    path = draw(st.sampled_from(PATHS))
    kind = draw(st.sampled_from(["bytes", "not_object", "truncated", "too_large"]))
    if kind == "bytes":
        raw = draw(st.binary(max_size=64))
    elif kind == "not_object":
        raw = encode(draw(st.one_of(json_scalars, st.lists(json_values, max_size=3))))
    elif kind == "truncated":
        _, whole, _ = draw(valid_mask_case())
        raw = whole[: draw(st.integers(0, max(0, len(whole) - 1)))]
    else:
        mask = draw(st.booleans())
        body = {"return_sampling_mask": mask, "prompt": "x" * (MAX_BODY_BYTES + 1)}
        raw = encode(body)
    return path, raw, None

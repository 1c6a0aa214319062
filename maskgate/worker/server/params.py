"""Sampling parameters of a request: strict parsing, validation and defaults.

Types are checked strictly, as the gateway's policy does (`"20"` is not an int, `true` is not
a number), so a request means the same thing whichever of the two answers it. Fields the
worker cannot honour (penalties, logit bias, grammars) are refused with 400 `unsupported_parameter` rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from maskgate.protocol.errors import ApiError
from maskgate.protocol.fields import GREEDY_TEMPERATURE, Fields, float32, is_int, json_type
from maskgate.worker.engine.batch import SamplingParams
from maskgate.worker.engine.sequence import StopRule

DEFAULT_MAX_NEW_TOKENS = 128  # /generate default, as in SGLang
MAX_SEED = 2**63 - 1
MAX_N = 64
MAX_STOP_STRINGS = 16

# Fields accepted in /generate `sampling_params` that change nothing when neutral.
_NEUTRAL = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
}
_ACCEPTED_NOOPS = ("skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
_GENERATE_FIELDS = frozenset(
    {
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "sampling_seed",
        "n",
        "custom_params",
        *_NEUTRAL,
        *_ACCEPTED_NOOPS,
    }
)


@dataclass(frozen=True, slots=True)
class GenParams:
    """One prompt's generation parameters; `n` completions are sampled from it."""

    sampling: SamplingParams
    rule: StopRule
    n: int = 1
    # custom_params.return_top_p_token_ids on a row whose sampling keeps a subset of the
    # vocabulary (or is greedy): its tokens' supports come back as top_p_token_ids.
    top_p_ids: bool = False

    def choice_params(self, j: int) -> SamplingParams:
        """Choice `j` of `n`: a distinct seed per choice, derived deterministically so that
        the same request gives the same `n` completions; choice 0 keeps the given seed."""
        seed = self.sampling.seed
        if seed is None or j == 0:
            return self.sampling
        mixed = (seed ^ (j * 0x9E3779B97F4A7C15)) & MAX_SEED  # golden-ratio stride
        return replace(self.sampling, seed=mixed)


def invalid(param: str, problem: str) -> ApiError:
    return ApiError("invalid_parameter", f"{param} {problem}", param=param)


def per_item(value: Any, size: int, is_batch: bool, name: str) -> list[Any]:
    """A /generate field as one value per prompt: a batch may send a list of `size` values,
    a single request must not send a list; a scalar applies to every prompt."""
    if isinstance(value, list):
        if not is_batch or len(value) != size:
            want = f"a list of {size} values (one per prompt)" if is_batch else "not a list"
            raise invalid(name, f"must be {want} here")
        return value
    return [value] * size


def unsupported(param: str, what: str) -> ApiError:
    return ApiError(
        "unsupported_parameter", f"{param}: {what} is not supported by this worker", param=param
    )


def parse_generate_params(sp: Any, where: str = "sampling_params") -> GenParams:
    """`/generate` `sampling_params` (one object) -> GenParams."""
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise invalid(where, f"must be an object, not {json_type(sp)}")
    unknown = sorted(set(sp) - _GENERATE_FIELDS)
    if unknown:
        raise invalid(f"{where}.{unknown[0]}", "is not a known sampling parameter")
    _check_neutral(sp, where + ".")
    max_new = opt_int(sp, "max_new_tokens", where + ".", minimum=0)
    sampling = parse_sampling(sp, where + ".", seed_field="sampling_seed")
    return GenParams(
        sampling=sampling,
        rule=parse_stop_rule(
            sp, where + ".", DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new
        ),
        n=opt_int(sp, "n", where + ".", minimum=1, maximum=MAX_N) or 1,
        top_p_ids=_top_p_ids(sp.get("custom_params"), where + ".custom_params")
        and truncates(sampling),
    )


def _top_p_ids(custom: Any, where: str) -> bool:
    """SGLang's `custom_params` is a free object read by custom logit processors; this worker
    runs none, so it acts on the one key it knows, `return_top_p_token_ids` (a bool, as slime
    sends it), and ignores the others."""
    if custom is None:
        return False
    if not isinstance(custom, dict):
        raise invalid(where, f"must be an object, not {json_type(custom)}")
    flag = custom.get("return_top_p_token_ids")
    if flag is not None and not isinstance(flag, bool):
        raise invalid(where + ".return_top_p_token_ids", f"must be a bool, not {json_type(flag)}")
    return bool(flag)


def truncates(p: SamplingParams) -> bool:
    """Whether sampling keeps less than the whole vocabulary: greedy, or a top-k, top-p or
    min-p filter in force (decided on float32 values, as the kernels decide)."""
    return (
        float32(p.temperature) < GREEDY_TEMPERATURE
        or p.top_k > 0
        or float32(p.top_p) < 1.0
        or float32(p.min_p) > 0
    )


def parse_openai_params(
    body: Mapping[str, Any], max_tokens_default: int, *, echo: bool = False
) -> GenParams:
    """Chat / completions body -> GenParams. `max_tokens_default` applies when unset; `echo`
    (completions) allows echo=true, which the caller answers."""
    for name, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
        value = opt_number(body, name, "")
        if value is not None and value != neutral:
            raise unsupported(name, f"{name}={value}")
    if body.get("logit_bias") not in (None, {}):
        raise unsupported("logit_bias", "a non-empty logit_bias")
    if not echo and body.get("echo") not in (None, False):
        raise unsupported("echo", "echo=true")
    if body.get("best_of") not in (None, 1):
        raise unsupported("best_of", "best_of > 1")
    if body.get("tools") not in (None, []):
        raise unsupported("tools", "tool calling")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise unsupported("response_format", "a response_format other than text")
    max_tokens = opt_int(body, "max_tokens", "", minimum=0)
    if max_tokens is None:
        max_tokens = opt_int(body, "max_completion_tokens", "", minimum=0)
    return GenParams(
        sampling=parse_sampling(body, "", seed_field="seed"),
        rule=parse_stop_rule(body, "", max_tokens_default if max_tokens is None else max_tokens),
        n=opt_int(body, "n", "", minimum=1, maximum=MAX_N) or 1,
    )


def parse_sampling(d: Mapping[str, Any], where: str, *, seed_field: str) -> SamplingParams:
    p = _FIELDS.sampling(d, where)
    return SamplingParams(
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        min_p=p.min_p,
        seed=opt_int(d, seed_field, where, minimum=0, maximum=MAX_SEED),
    )


def parse_stop_rule(d: Mapping[str, Any], where: str, max_new_tokens: int) -> StopRule:
    stop = d.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise invalid(where + "stop", "must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise invalid(where + "stop", f"must hold 1-{MAX_STOP_STRINGS} non-empty strings")
    ids = d.get("stop_token_ids")
    if ids is None:
        ids = []
    if not isinstance(ids, list) or not all(is_int(i) and i >= 0 for i in ids):
        raise invalid(where + "stop_token_ids", "must be a list of non-negative integers")
    ignore_eos = d.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise invalid(where + "ignore_eos", f"must be a bool, not {json_type(ignore_eos)}")
    return StopRule(max_new_tokens, stops, frozenset(ids), ignore_eos)


def _check_neutral(sp: Mapping[str, Any], where: str) -> None:
    for name, neutral in _NEUTRAL.items():
        value = opt_number(sp, name, where)
        if value is not None and value != neutral:
            raise unsupported(where + name, f"{name}={value}")


# --- strict typed access: the gateway's reads, with the worker's error code ----------------

_FIELDS = Fields(invalid)
opt_bool = _FIELDS.boolean
opt_number = _FIELDS.number
opt_int = _FIELDS.integer

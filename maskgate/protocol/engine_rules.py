"""What a mask pool's engine can serve, checked before a mask request reaches it.

A pool of maskgate workers (`engine: maskgate`) serves every mask the policy admits. A pool of
SGLang engines (`engine: sglang`) returns masks only with a finite `top_k` no larger than its
`--sampling-mask-max-tokens` (`sampling_mask_max_tokens`), never on `/v1/completions`, never
in bounded mode and never in a chat stream (rule 5 already refuses streamed chat masks).
Anything else gets 400 `sampling_mask_engine_unsupported`, whose message names the pool that
could serve it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.policy import Route

Engine = Literal["maskgate", "sglang"]
# SGLang's --sampling-mask-max-tokens default: `pools.<name>.sampling_mask_max_tokens`.
ENGINE_MASK_CAP = 4096
CODE = "sampling_mask_engine_unsupported"
_ELSEWHERE = "a pool of maskgate workers (engine: maskgate) serves it, top-p-only masks included"


def check_engine(
    route: Route, body: Mapping[str, Any], engine: Engine, cap: int, pool: str
) -> None:
    """`body` is the policy's output (resolved sampling parameters written in)."""
    if engine != "sglang":
        return
    where = f"the {pool} pool runs SGLang, which"
    if route is Route.COMPLETIONS:
        raise PolicyError(
            CODE,
            f"{where} does not return sampling masks on /v1/completions; use /generate or "
            f"/v1/chat/completions, or {_ELSEWHERE}",
            param="return_sampling_mask",
        )
    if body.get("sampling_mask_mode") not in (None, "exact"):
        raise PolicyError(
            CODE,
            f"{where} has no bounded mask mode (SGLang refuses a mask past its cap); {_ELSEWHERE}",
            param="sampling_mask_mode",
        )
    if route is Route.CHAT and body.get("stream") is True:
        raise PolicyError(CODE, f"{where} does not stream chat masks; {_ELSEWHERE}", param="stream")
    for param, top_k in _masked_top_ks(route, body):
        if not 0 < top_k <= cap:
            raise PolicyError(
                CODE,
                f"{where} returns sampling masks only with a finite top_k <= {cap} (its "
                f"sampling_mask_max_tokens); got top_k={top_k}. Set top_k, or send the "
                f"request where {_ELSEWHERE}.",
                param=param,
            )


def _masked_top_ks(route: Route, body: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(param, resolved top_k) of every prompt that asks for a mask."""
    if route is not Route.GENERATE:
        return [("top_k", body["top_k"])]
    sp = body["sampling_params"]
    flags = body["return_sampling_mask"]
    if isinstance(sp, dict):
        return [("sampling_params.top_k", sp["top_k"])]
    if not isinstance(flags, list):
        flags = [flags] * len(sp)
    return [
        (f"sampling_params[{i}].top_k", item["top_k"])
        for i, (item, flag) in enumerate(zip(sp, flags, strict=True))
        if flag
    ]

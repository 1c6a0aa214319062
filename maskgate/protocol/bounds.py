"""The ranges of the numeric request fields: one table that both the mask policy's checks
(fields.py) and the published OpenAPI schema (gateway/openapi.py) are made from, so the
schema never admits a value the policy refuses, nor the other way round.

The worker samples with float32 values, and a range holds for the float32 value (top_p =
1e-46 is 0 in float32, so it is refused; top_p = 1 + 1e-9 is 1 in float32, so it is taken).
Each bound here is the float64 value where the float32 answer changes (IEEE round to nearest,
ties to even), so one comparison in float64 decides, and JSON Schema can state it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FLOAT32_MAX = 3.4028234663852886e38
# The largest float64 that float32 rounds to 0 (half the smallest subnormal, a tie to 0).
F32_ZERO_EDGE = 2.0**-150
# The largest float64 that float32 rounds to 1.0 (half an ulp above 1, a tie to 1.0).
F32_ONE_EDGE = 1.0 + 2.0**-24
# The smallest float64 that float32 rounds to infinity (half an ulp above FLOAT32_MAX).
F32_INF_EDGE = FLOAT32_MAX + 2.0**103


@dataclass(frozen=True, slots=True)
class Bound:
    """`integer` fields take JSON integers only; the others any finite JSON number."""

    integer: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    note: str = ""  # how the message says it, when the float32 edges would confuse

    def admits(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        return not (
            (self.minimum is not None and value < self.minimum)
            or (self.maximum is not None and value > self.maximum)
            or (self.exclusive_minimum is not None and value <= self.exclusive_minimum)
            or (self.exclusive_maximum is not None and value >= self.exclusive_maximum)
        )

    def describe(self) -> str:
        if self.note:
            return self.note
        low = f">= {self.minimum:g}" if self.minimum is not None else ""
        high = f"<= {self.maximum:g}" if self.maximum is not None else ""
        return " and ".join(p for p in (low, high) if p)

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer" if self.integer else "number"}
        for key, value in (
            ("minimum", self.minimum),
            ("maximum", self.maximum),
            ("exclusiveMinimum", self.exclusive_minimum),
            ("exclusiveMaximum", self.exclusive_maximum),
        ):
            if value is not None:
                out[key] = int(value) if self.integer else value
        return out


_COUNT = Bound(integer=True, minimum=0)
BOUNDS: dict[str, Bound] = {
    "temperature": Bound(
        minimum=0.0,
        exclusive_maximum=F32_INF_EDGE,
        note=f">= 0 and finite in float32 (at most {FLOAT32_MAX:.7g})",
    ),
    "top_p": Bound(
        exclusive_minimum=F32_ZERO_EDGE,
        maximum=F32_ONE_EDGE,
        note="in (0, 1] (in float32, as sampled)",
    ),
    "min_p": Bound(minimum=0.0, maximum=F32_ONE_EDGE, note="in [0, 1] (in float32, as sampled)"),
    "top_k": Bound(integer=True, minimum=-1),
    "n": Bound(integer=True, minimum=1),
    "best_of": Bound(integer=True, minimum=1),
    "max_tokens": _COUNT,
    "max_completion_tokens": _COUNT,
    "max_new_tokens": _COUNT,
    "min_tokens": _COUNT,
    "min_new_tokens": _COUNT,
    "top_logprobs": _COUNT,
    "top_logprobs_num": _COUNT,
    "logprob_start_len": Bound(integer=True, minimum=-1),
}

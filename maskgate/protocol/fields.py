"""Strict typed reads of a JSON body's fields ("20" is not an int, true is not a number).

The gateway's mask policy and the worker's parameter parsing read fields through the same
`Fields`, so a bad field gets the same status and message whichever of the two answers; each
passes its own error maker, which names the error code (the policy's
`sampling_mask_invalid_param`, the worker's `invalid_parameter`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from maskgate.protocol.bounds import BOUNDS
from maskgate.protocol.errors import ApiError

# Defaults applied when a sampling field is absent or null (docs/design.md, Policy, rule 7).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_K = -1
DEFAULT_TOP_P = 1.0
DEFAULT_MIN_P = 0.0
# A row samples greedily when its float32 temperature is below this, compared in float64 as
# the worker's kernels do (docs/design.md, Mask semantics).
GREEDY_TEMPERATURE = 1e-6


def float32(x: float) -> float:
    """Round a Python float to the nearest float32 (0.99999999 -> 1.0, 1e-46 -> 0.0, 1e39 ->
    inf): the value the worker samples with."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:  # struct refuses finite values that round to inf
        return math.copysign(math.inf, x)


@dataclass(frozen=True, slots=True)
class ResolvedParams:
    """The four sampling fields, checked, with the defaults applied."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
        }


@dataclass(frozen=True, slots=True)
class Fields:
    """Typed field access; `invalid(param, problem)` makes the error a bad field raises.

    `where` prefixes the field's name in `param` and the message (`""` or `"sampling_params."`).
    """

    invalid: Callable[[str, str], ApiError]

    def boolean(
        self, d: Mapping[str, Any], name: str, where: str = "", *, required: bool = False
    ) -> bool | None:
        value = d.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, bool):
            raise self.invalid(where + name, f"must be a bool, not {json_type(value)}")
        return value

    def number(self, d: Mapping[str, Any], name: str, where: str) -> float | None:
        value = d.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.invalid(where + name, f"must be a number, not {json_type(value)}")
        if not math.isfinite(value):
            raise self.invalid(where + name, f"must be finite, got {value}")
        return float(value)

    def integer(
        self,
        d: Mapping[str, Any],
        name: str,
        where: str,
        *,
        minimum: int,
        maximum: int | None = None,
    ) -> int | None:
        value = d.get(name)
        if value is None:
            return None
        if not is_int(value):
            raise self.invalid(where + name, f"must be an integer, not {json_type(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise self.invalid(where + name, f"must be {bound}, got {value}")
        return int(value)

    def bounded(self, d: Mapping[str, Any], name: str, where: str) -> float | None:
        """A numeric field read by its row of bounds.BOUNDS (the published schema's ranges)."""
        bound = BOUNDS[name]
        if bound.integer:
            value = d.get(name)
            if value is not None and not is_int(value):
                raise self.invalid(where + name, f"must be an integer, not {json_type(value)}")
        else:
            value = self.number(d, name, where)
        if value is not None and not bound.admits(value):
            raise self.invalid(where + name, f"must be {bound.describe()}, got {value}")
        return value

    def count(self, d: Mapping[str, Any], name: str, where: str) -> int | None:
        """An integer field of bounds.BOUNDS."""
        value = self.bounded(d, name, where)
        return None if value is None else int(value)

    def sampling(self, d: Mapping[str, Any], where: str) -> ResolvedParams:
        """temperature, top_p, min_p and top_k: types first, then ranges (for the float32
        values the worker samples with: bounds.py), then defaults."""
        for name in ("temperature", "top_p", "min_p"):
            self.number(d, name, where)
        top_k = self.count(d, "top_k", where)
        temperature = self.bounded(d, "temperature", where)
        top_p = self.bounded(d, "top_p", where)
        min_p = self.bounded(d, "min_p", where)
        return ResolvedParams(
            temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
            top_k=DEFAULT_TOP_K if top_k is None else top_k,
            top_p=DEFAULT_TOP_P if top_p is None else top_p,
            min_p=DEFAULT_MIN_P if min_p is None else min_p,
        )


def is_int(value: Any) -> bool:
    """A JSON integer: an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def json_type(value: Any) -> str:
    """How an error message names a JSON value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"

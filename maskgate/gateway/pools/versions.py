"""Weight versions: their order, and what a pool reports as its version.

SGLang's weight versions are free-form strings (`"default"` until a trainer sets one; slime and
Miles send the training step, `str(step)`). The order the gateway uses:
- both versions are non-negative decimal integers: compared as numbers ("10" > "9");
- otherwise: only the same string counts as "at or above" (there is no order between "v1"
  and "v2", and guessing one would route a request to weights it did not ask for).
"""

from __future__ import annotations

from collections.abc import Iterable

MIXED = "mixed"  # the pool's version when its serving endpoints disagree


def _as_int(version: str) -> int | None:
    return int(version) if version.isascii() and version.isdigit() else None


def at_least(version: str | None, wanted: str) -> bool:
    """True when an endpoint at `version` may serve a request asking for `wanted` or newer."""
    if version is None:
        return False
    if version == wanted:
        return True
    have, want = _as_int(version), _as_int(wanted)
    return have is not None and want is not None and have >= want


def normalize(value: object) -> str | None:
    """A version from a request (body field or header): a string, or an int as SGLang would
    turn it into one; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return str(value)
    if isinstance(value, str) and value and len(value) <= 256 and value.isprintable():
        return value
    return None


def strict_version(value: object) -> str | None:
    """A version from a control body (`weight_version`, `new_version`): SGLang's fields are
    strings, so only a non-empty printable string of at most 256 characters is one."""
    return normalize(value) if isinstance(value, str) else None


def pool_version(versions: Iterable[str | None]) -> str | None:
    """One version when every endpoint agrees, `MIXED` when they do not, None when no endpoint
    has reported one."""
    seen = set(versions)
    if not seen:
        return None
    return seen.pop() if len(seen) == 1 else MIXED

"""The request ids in flight on this worker: a rid names one request at a time.

`/abort_request {"rid"}` aborts the sequences named `rid` or `rid-<k>`. Two requests holding
the same rid would both be hit, so a request whose rid (or one of its sequences' rids) is
already held is refused with 400 `duplicate_request_id`, as SGLang refuses one ("Duplicate
request ID detected"). The ids are claimed before the request reaches the engine and released
when its handler ends, whatever the outcome. Only the event loop touches the set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from maskgate.protocol.errors import ApiError


class InFlight:
    def __init__(self) -> None:
        self._held: set[str] = set()

    def __contains__(self, rid: str) -> bool:
        return rid in self._held

    @contextmanager
    def claim(self, rids: Iterable[str]) -> Iterator[None]:
        """Hold `rids` for the duration of the block; refuse the request (changing nothing)
        when one of them is held, or named twice by the request itself."""
        wanted: set[str] = set()
        for rid in rids:
            if rid in self._held or rid in wanted:
                raise duplicate(rid)
            wanted.add(rid)
        self._held |= wanted
        try:
            yield
        finally:
            self._held -= wanted


def duplicate(rid: str) -> ApiError:
    return ApiError("duplicate_request_id", f"Duplicate request ID detected: {rid}", param="rid")

"""Reading the JSON bodies of the control endpoints (SGLang's shapes): typed fields with
defaults, unknown fields ignored (as SGLang's request structs do), and options this worker
does not implement refused with a 400 that names them."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from maskgate.protocol.fields import is_int, json_type
from maskgate.worker.params import invalid, unsupported


class Body:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @classmethod
    async def read(cls, request: web.Request) -> Body:
        """An empty body is `{}` (SGLang's callers often send none)."""
        raw = await request.read()
        if not raw.strip():
            return cls({})
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise invalid("body", f"is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise invalid("body", f"must be a JSON object, not {json_type(data)}")
        return cls(data)

    def string(self, name: str, default: str | None = None, *, required: bool = False) -> Any:
        value = self.data.get(name)
        if value is None:
            if required:
                raise invalid(name, "is required")
            return default
        if not isinstance(value, str):
            raise invalid(name, f"must be a string, not {json_type(value)}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise invalid(name, f"must be a bool, not {json_type(value)}")
        return value

    def integer(self, name: str, *, minimum: int, maximum: int | None = None) -> int:
        value = self.data.get(name)
        if value is None:
            raise invalid(name, "is required")
        if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise invalid(name, f"must be an integer {bound}, got {value!r}")
        return int(value)

    def string_list(self, name: str, *, required: bool = True) -> list[Any] | None:
        value = self.data.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, list):
            raise invalid(name, f"must be a list, not {json_type(value)}")
        if not all(isinstance(v, str) for v in value):
            raise invalid(name, "must hold only strings")
        return value

    def shapes(self, name: str) -> list[list[int]]:
        value = self.data.get(name)
        if not isinstance(value, list) or not all(
            isinstance(s, list) and all(is_int(d) and d >= 0 for d in s) for s in value
        ):
            raise invalid(name, "must be a list of shapes (lists of non-negative integers)")
        return value

    def refuse(self, name: str, allowed: tuple[Any, ...], what: str) -> None:
        """400 when `name` is present with a value outside `allowed` (null always passes)."""
        value = self.data.get(name)
        if value is not None and value not in allowed:
            raise unsupported(name, f"{what} ({name}={value!r}; supported: {list(allowed)})")

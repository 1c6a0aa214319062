"""Reading the JSON bodies of the control endpoints (SGLang's shapes): typed fields with
defaults, unknown fields ignored (as SGLang's request structs do), and options this worker
does not implement refused with a 400 that names them.

Integer fields take what SGLang's request parsing (pydantic, lax mode) takes: a JSON integer,
a string of decimal digits ("29500", as SGLang's own tests send `master_port`), or a float
with no fractional part. Booleans are never integers."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from maskgate.protocol.fields import is_int, json_type
from maskgate.worker.server.params import invalid, unsupported


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

    def integer(
        self, name: str, *, minimum: int, maximum: int | None = None, default: int | None = None
    ) -> int:
        value = self.data.get(name)
        if value is None:
            if default is not None:
                return default
            raise invalid(name, "is required")
        number = as_int(value)
        if number is None or number < minimum or (maximum is not None and number > maximum):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            shown = repr(value) if len(repr(value)) <= 40 else json_type(value)
            raise invalid(name, f"must be an integer {bound}, got {shown}")
        return number

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
        shapes = (
            [[as_int(d) for d in s] if isinstance(s, list) else None for s in value]
            if isinstance(value, list)
            else None
        )
        if shapes is None or not all(
            s is not None and all(d is not None and 0 <= d < 2**48 for d in s) for s in shapes
        ):
            raise invalid(name, "must be a list of shapes (lists of non-negative integers)")
        return shapes  # type: ignore[return-value]

    def refuse(self, name: str, allowed: tuple[Any, ...], what: str) -> None:
        """400 when `name` is present with a value outside `allowed` (null always passes)."""
        value = self.data.get(name)
        if value is not None and value not in allowed:
            raise unsupported(name, f"{what} ({name}={value!r}; supported: {list(allowed)})")


def as_int(value: Any) -> int | None:
    """`value` as SGLang's request parsing reads an int field, None when it is not one."""
    if is_int(value):
        return int(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, str) and 0 < len(value.strip()) <= 20:
        text = value.strip()
        digits = text[1:] if text[0] in "+-" else text
        if digits.isascii() and digits.isdigit():
            return int(text)
    return None

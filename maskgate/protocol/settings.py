"""The one conversion path for configuration: YAML file, then environment, then CLI flags.

Every source is turned into a plain nested dict, the dicts are merged in that order (later
wins), and the merged dict is validated once by the pydantic model. Nothing else converts
configuration, so a value means the same thing whichever source it came from.

Environment variables: `{prefix}FIELD` sets a top-level field, `{prefix}A__B` sets `a.b`.
Values are parsed as YAML scalars/flow collections, so `8080`, `true`, `[a, b]` and
`{x: 1}` work the way they would in the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """Configuration that cannot start the process; the message names every bad field."""


def read_yaml(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, not {type(data).__name__}")
    return data


def env_overrides(
    env: Mapping[str, str], prefix: str, ignore: tuple[str, ...] = ()
) -> dict[str, Any]:
    """`ignore`: longer prefixes that belong to another process's config (the gateway reads
    `MASKGATE_*` but must leave the worker's `MASKGATE_WORKER_*` alone)."""
    out: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith(prefix) or name == prefix or name.startswith(ignore):
            continue
        path = [part.lower() for part in name[len(prefix) :].split("__")]
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        _set_path(out, path, value)
    return out


def merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `top` over `base` (mappings merge, everything else replaces)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_settings(
    model: type[M],
    *,
    file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    env_prefix: str = "MASKGATE_",
    env_ignore: tuple[str, ...] = (),
    overrides: Mapping[str, Any] | None = None,
) -> M:
    """Build and validate `model` from file < env < overrides. Raises ConfigError."""
    data: dict[str, Any] = read_yaml(file) if file is not None else {}
    if env is not None:
        data = merge(data, env_overrides(env, env_prefix, env_ignore))
    if overrides:
        data = merge(data, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, model.__name__)) from e


def format_validation_error(err: ValidationError, what: str) -> str:
    lines = [f"invalid {what}:"]
    for item in err.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(root)"
        lines.append(f"  {field}: {item['msg']}")
    return "\n".join(lines)


def _set_path(out: dict[str, Any], path: list[str], value: Any) -> None:
    node = out
    for key in path[:-1]:
        nxt = node.get(key)
        if not isinstance(nxt, dict):
            nxt = node[key] = {}
        node = nxt
    node[path[-1]] = value

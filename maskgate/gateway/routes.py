"""Which route a request takes: its label, its policy route and the path sent upstream.

The inference routes are classified by *path* for every method, so a body can never reach an
upstream's inference handler unchecked by arriving with another method (SGLang serves
`/generate` on PUT as well as POST) or another spelling of the path:

- A method the route does not take answers 405 `method_not_allowed` with `Allow`.
- A path that is not spelled canonically but means an inference route to some server
  (`//v1/chat/completions`, `/V1/completions`, `/./generate`, `/%67enerate`,
  `/v1%2Fcompletions`, `/generate/`, `/generate;x`) is classified as that route, and the
  canonical path is what goes upstream, so the policy and the upstream's router always agree.

Canonical form (`canonical_path`): percent-decoding repeated until stable (at most
`_DECODE_ROUNDS` rounds), backslashes read as slashes, `;params` cut from each segment, empty
and `.` segments dropped, `..` resolved, lower case. It folds more spellings together than any
upstream router does, which is the safe direction: a false match costs a policy check, a
missed one would let a mask request past it.
"""

from __future__ import annotations

from urllib.parse import unquote

from maskgate.protocol.errors import ApiError
from maskgate.protocol.policy import Route

# Canonical path -> (route label, policy route, the methods the route takes).
INFERENCE: dict[str, tuple[str, Route, tuple[str, ...]]] = {
    "/v1/chat/completions": ("chat", Route.CHAT, ("POST",)),
    "/v1/completions": ("completions", Route.COMPLETIONS, ("POST",)),
    "/generate": ("generate", Route.GENERATE, ("POST", "PUT")),
}
MODELS_PATH = "/v1/models"
HOT_PATHS = (*INFERENCE, MODELS_PATH)  # routed by exact path (app.py)
_DECODE_ROUNDS = 4


def classify(method: str, target: str) -> tuple[str, Route | None, str]:
    """(route label, policy route or None, request target to send upstream) for a request.

    `target` is the raw request target (path and query, still percent-encoded). Raises 405
    for a method an inference route does not take."""
    path, sep, query = target.partition("?")
    hit = INFERENCE.get(path)
    if hit is None:
        if path == MODELS_PATH:
            return ("models", None, target) if method == "GET" else ("other", None, target)
        canonical = canonical_path(path)
        hit = INFERENCE.get(canonical)
        if hit is None:
            return "other", None, target
        target = canonical + sep + query
    label, route, methods = hit
    if method not in methods:
        raise method_not_allowed(method, label, methods)
    return label, route, target


def canonical_path(path: str) -> str:
    """The path with every spelling difference an upstream router might ignore removed."""
    for _ in range(_DECODE_ROUNDS):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    segments: list[str] = []
    for segment in path.replace("\\", "/").split("/"):
        segment = segment.partition(";")[0]
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments).lower()


def method_not_allowed(method: str, label: str, methods: tuple[str, ...]) -> ApiError:
    path = next(p for p, hit in INFERENCE.items() if hit[0] == label)
    allowed = ", ".join(methods)
    return ApiError(
        "method_not_allowed",
        f"{path} takes {allowed}, not {method}",
        status=405,
        headers={"Allow": allowed},
    )

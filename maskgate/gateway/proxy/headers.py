"""The headers a request carries upstream.

- Hop-by-hop headers (RFC 9110 7.6.1) are dropped: the fixed set, and every header named in
  any `Connection` header (all of them, each a comma list).
- `Host`, `Content-Length` and `Expect` are the upstream connection's own; `X-Request-Id` is
  set by the gateway.
- Client-address headers (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`) are dropped, unless the
  peer is in `trusted_proxies`: then its chain is kept and the peer's address is appended to
  `X-Forwarded-For` (and to `Forwarded` when it sent one). A client cannot make the upstream
  believe it comes from elsewhere; behind a trusted proxy, the chain is complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from maskgate.gateway.clients.access import is_trusted
from maskgate.gateway.proxy.relay import HOP_BY_HOP
from maskgate.gateway.state import GatewayState

CLIENT_ADDRESS = frozenset({"x-forwarded-for", "forwarded", "x-real-ip"})
_DROP = HOP_BY_HOP | CLIENT_ADDRESS | {"host", "content-length", "expect", "x-request-id"}
_CONNECTION_OPTIONS = frozenset({"", "close", "keep-alive"})


def connection_listed(values: Sequence[str]) -> frozenset[str]:
    """Lower-case header names listed in `Connection` headers (options such as `close` are
    not header names and are left out)."""
    names = {token.strip().lower() for value in values for token in value.split(",")}
    return frozenset(names - _CONNECTION_OPTIONS)


def upstream_headers(
    request: web.Request,
    state: GatewayState,
    rid: str,
    *,
    mask: bool,
    decoded: bool,
) -> list[tuple[str, str]]:
    """`decoded`: the body was decompressed here, so `Content-Encoding` no longer applies."""
    cfg = state.config
    req_headers = request.headers
    drop = _DROP
    listed: frozenset[str] = frozenset()
    if "Connection" in req_headers:
        listed = connection_listed(req_headers.getall("Connection"))
        drop = drop | listed
    if decoded:
        drop = drop | {"content-encoding"}
    drop_auth = cfg.upstream_api_key is not None or bool(state.api_keys)
    trusted = is_trusted(request.remote, state.trusted_proxies)
    headers: list[tuple[str, str]] = []
    chain: list[str] = []
    forwarded: list[str] = []
    for name, value in req_headers.items():
        lname = name.lower()
        if lname in drop:
            if trusted and lname in CLIENT_ADDRESS and lname not in listed:
                if lname == "x-forwarded-for":
                    chain.append(value)
                elif lname == "forwarded":
                    forwarded.append(value)
                else:
                    headers.append((name, value))
            continue
        if (drop_auth and lname == "authorization") or (mask and lname == "accept-encoding"):
            continue  # the gateway's own credential / the mask check reads the body plain
        headers.append((name, value))
    if trusted:
        peer = request.remote or ""
        headers.append(("X-Forwarded-For", ", ".join([*chain, peer])))
        if forwarded:
            node = f'"[{peer}]"' if ":" in peer else peer
            headers.append(("Forwarded", ", ".join([*forwarded, f"for={node}"])))
    if cfg.upstream_api_key is not None:
        headers.append(("Authorization", f"Bearer {cfg.upstream_api_key}"))
    headers.append(("X-Request-Id", rid))
    return headers

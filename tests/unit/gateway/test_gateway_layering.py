"""The gateway's wings import one way, and its import chains stay short.

Read from the source (AST), not by importing it. A module's imports are those that run when it
loads: at module level and in class bodies, but not inside functions and not under
`if TYPE_CHECKING:`. A parent package that Python loads on the way (`maskgate.gateway` for
`maskgate.gateway.pools.pool`) is not counted as an import of the module.

Wings, from the top (each may import only those below it; wings on one line never import
each other):

    cli -> processes -> app -> routes, openapi -> api -> cluster -> rl, proxy -> clients
        -> pools -> state -> upstream, observability, config, auth

`clients` (who may call a row, reading a request body, client connection bounds) sits below
the RL wing and the proxy, as both of them and the cluster's middlewares use it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = "maskgate.gateway"
GATEWAY = ROOT / "maskgate" / "gateway"
ORDER: tuple[tuple[str, ...], ...] = (
    ("__init__", "__main__"),
    ("cli",),
    ("processes",),
    ("app",),
    ("routes", "openapi"),
    ("api",),
    ("cluster",),
    ("rl", "proxy"),
    ("clients",),
    ("pools",),
    ("state",),
    ("upstream", "observability", "config", "auth"),
)
RANK = {part: rank for rank, parts in enumerate(ORDER) for part in parts}
MAX_CHAIN = 9  # files, the importing one included


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        rel = path.relative_to(GATEWAY).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join((PACKAGE, *parts))] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The gateway modules an import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert node.level == 0, "the gateway imports by absolute name"
        base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    return sorted({name for name in names if name in MODULES})


def _walk(body: list[ast.stmt], *, in_functions: bool) -> list[str]:
    found: list[str] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += _targets(node)
        elif isinstance(node, ast.If) and _is_type_checking(node):
            found += _walk(node.orelse, in_functions=in_functions)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if in_functions:
                found += _walk(node.body, in_functions=True)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    stmts = [s.body if isinstance(s, ast.ExceptHandler) else [s] for s in inner]
                    found += _walk([s for group in stmts for s in group], in_functions=in_functions)
    return found


def imports(module: str, *, in_functions: bool = False) -> list[str]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    return sorted(set(_walk(tree.body, in_functions=in_functions)) - {module})


def part(module: str) -> str:
    """The wing a module belongs to: its subpackage, or its own name at the top level."""
    rest = module.removeprefix(PACKAGE).lstrip(".")
    return rest.split(".")[0] if rest else "__init__"


@cache
def longest_chain(module: str, seen: frozenset[str] = frozenset()) -> tuple[str, ...]:
    assert module not in seen, f"import cycle: {' -> '.join(seen)} -> {module}"
    chains = [longest_chain(dep, seen | {module}) for dep in imports(module)]
    return (module, *max(chains, key=len, default=()))


def test_every_module_belongs_to_a_wing() -> None:
    assert {part(m) for m in MODULES} <= set(RANK), "a new gateway module needs a place in ORDER"


def test_imports_point_down_the_wings() -> None:
    up = [
        f"{m} imports {dep}"
        for m in MODULES
        for dep in imports(m, in_functions=True)
        if part(dep) != part(m) and RANK[part(m)] >= RANK[part(dep)]
    ]
    assert not up, "\n".join(up)


def test_the_longest_import_chain_is_short() -> None:
    chain = max((longest_chain(m) for m in MODULES), key=len)
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_the_walk_sees_module_level_imports_only() -> None:
    # state holds the pools, the proxy's checker and the upstream client, but only names
    # their types; cli starts processes from inside its functions.
    assert imports(f"{PACKAGE}.state") == [f"{PACKAGE}.config"]
    assert f"{PACKAGE}.processes.serve" not in imports(f"{PACKAGE}.cli")
    assert f"{PACKAGE}.processes.serve" in imports(f"{PACKAGE}.cli", in_functions=True)

"""One import namespace, imports pointing one way.

Bare top-level names (`gateway`, `worker`, `kernels`) collide with other distributions in a
user's environment (transformers 5 imports HuggingFace's `kernels`), so nothing may import
them. Inside `maskgate`, the gateway and the protocol stay torch-free and never reach into the
worker or the kernels.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("maskgate", "tests", "bench", "examples")
BARE = frozenset({"gateway", "worker", "kernels", "protocol"})
# package -> top-level modules (or maskgate subpackages) it must never import
FORBIDDEN = {
    "maskgate/protocol": ("maskgate.gateway", "maskgate.worker", "maskgate.kernels", "torch"),
    "maskgate/gateway": ("maskgate.worker", "maskgate.kernels", "torch", "triton"),
    "maskgate/worker": ("maskgate.gateway",),
    "maskgate/kernels": ("maskgate.gateway", "maskgate.worker"),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module an `import` or `from ... import` names in `path`, with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def python_files() -> list[Path]:
    return [p for d in SOURCES if (ROOT / d).is_dir() for p in sorted((ROOT / d).rglob("*.py"))]


def test_nothing_imports_a_bare_top_level_package() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in python_files()
        for line, name in imported_modules(path)
        if name.split(".")[0] in BARE
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    banned = FORBIDDEN[package]
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, name in imported_modules(path)
        if any(name == b or name.startswith(b + ".") for b in banned)
    ]
    assert not bad, "\n".join(bad)


# What `maskgate gateway` and `python -m maskgate.gateway` load before serving.
_GATEWAY_IMPORTS = """
import sys
import maskgate.cli, maskgate.gateway, maskgate.gateway.cli, maskgate.gateway.serve
import maskgate.gateway.supervisor, maskgate.protocol.policy
heavy = ("torch", "triton", "transformers", "maskgate.worker", "maskgate.kernels")
print(sorted(m for m in sys.modules if m.startswith(heavy)))
"""


def test_the_gateway_subcommand_loads_no_torch_triton_or_transformers() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _GATEWAY_IMPORTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_transformers_imports_beside_the_worker_and_kernels() -> None:
    """The break that moved everything under `maskgate`: with HuggingFace's `kernels`
    distribution installed, transformers must still import next to our packages."""
    pytest.importorskip("transformers")
    code = "import transformers.activations, maskgate.worker, maskgate.kernels; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]

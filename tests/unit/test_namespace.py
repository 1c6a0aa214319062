"""One import namespace, imports pointing one way.

Bare top-level names (`gateway`, `worker`, `kernels`) collide with other distributions in a
user's environment (transformers 5 imports HuggingFace's `kernels`), so nothing may import
them. Inside `maskgate`, the gateway and the protocol stay torch-free and never reach into the
worker or the kernels, and the worker reaches the kernels only through their public API: the
names `maskgate/kernels/__init__.py` exports, never a module beneath it. Above the runner, the
worker's engine (all of `maskgate/worker/engine` but the KV cache's allocation) is plain
Python: no torch, no Triton, no kernels, nothing of the runner, the model or the server.
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


ENGINE = ROOT / "maskgate" / "worker" / "engine"
ENGINE_DEVICE = frozenset({"kv_cache.py"})  # allocates the KV tensors the runner writes
ENGINE_BANNED = (
    "torch",
    "triton",
    "maskgate.kernels",
    "maskgate.worker.runner",
    "maskgate.worker.model",
    "maskgate.worker.server",
    "maskgate.worker.rl",
)


def engine_modules() -> list[Path]:
    return [p for p in sorted(ENGINE.glob("*.py")) if p.name not in ENGINE_DEVICE]


def test_the_engine_imports_nothing_below_it() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in engine_modules()
        for line, name in imported_modules(path)
        if any(name == b or name.startswith(b + ".") for b in ENGINE_BANNED)
    ]
    assert not bad, "\n".join(bad)


def test_importing_the_engine_loads_no_torch() -> None:
    """(`maskgate.worker` itself loads the server, which loads no torch either.)"""
    heavy = ("torch", "triton", "maskgate.kernels")
    modules = [f"maskgate.worker.engine.{p.stem}" for p in engine_modules() if p.stem != "__init__"]
    code = (
        f"import sys, {', '.join(modules)}\n"
        f"print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "maskgate.worker.engine.scheduler" in modules
    assert out.stdout.strip() == "[]", out.stdout


KERNELS_INIT = ROOT / "maskgate" / "kernels" / "__init__.py"


def kernels_api() -> frozenset[str]:
    """The names in maskgate.kernels' __all__ (read from its source: importing it loads torch)."""
    tree = ast.parse(KERNELS_INIT.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            return frozenset(ast.literal_eval(node.value))
    raise AssertionError(f"{KERNELS_INIT.relative_to(ROOT)} has no __all__")


def kernels_uses(path: Path, api: frozenset[str]) -> list[str]:
    """Where `path` reaches past maskgate.kernels' public API: an import of a module beneath
    it, an imported name it does not export, or an attribute of `kernels` (bound by
    `from maskgate import kernels`) that it does not export."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("maskgate.kernels.")
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [a.name for a in node.names]
            if node.module.startswith("maskgate.kernels."):
                bad.append(f"{node.lineno}: from {node.module} import {', '.join(names)}")
            elif node.module == "maskgate.kernels":
                bad += [
                    f"{node.lineno}: from maskgate.kernels import {n}"
                    for n in names
                    if n not in api
                ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "kernels"
            and node.attr not in api
        ):
            bad.append(f"{node.lineno}: kernels.{node.attr}")
    return bad


def test_the_worker_uses_only_the_kernels_public_api() -> None:
    api = kernels_api()
    bad = [
        f"{path.relative_to(ROOT)}:{use}"
        for path in sorted((ROOT / "maskgate" / "worker").rglob("*.py"))
        for use in kernels_uses(path, api)
    ]
    assert not bad, "\n".join(bad)


def test_the_kernels_public_api_check_sees_each_way_past_it(tmp_path: Path) -> None:
    """kernels_uses flags a submodule import (plain or from), a name __all__ lacks and an
    attribute of `kernels` past the API, and passes the public ways in."""
    src = tmp_path / "user.py"
    src.write_text(
        "import maskgate.kernels.reference\n"
        "from maskgate.kernels.triton.config import band_config\n"
        "from maskgate.kernels import sample, torch_path\n"
        "from maskgate import kernels\n"
        "import maskgate.kernels\n"
        "kernels.sample(1)\n"
        "kernels.triton.launch\n"
    )
    api = frozenset({"sample"})
    assert kernels_uses(src, api) == [
        "1: import maskgate.kernels.reference",
        "2: from maskgate.kernels.triton.config import band_config",
        "3: from maskgate.kernels import torch_path",
        "7: kernels.triton",
    ]
    assert "sample_sort_all_rows" in kernels_api()


# What `maskgate gateway` and `python -m maskgate.gateway` load before serving.
_GATEWAY_IMPORTS = """
import sys
import maskgate.cli, maskgate.gateway, maskgate.gateway.cli, maskgate.gateway.processes.serve
import maskgate.gateway.processes.supervisor, maskgate.protocol.policy
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

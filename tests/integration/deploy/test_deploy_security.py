"""Keys and network access in the shipped manifests: no key is ever written in a manifest, every
key reaches its process from the Secret `maskgate-api-keys` (as `create-secret.sh` makes it),
the gateway holds the workers' keys, the control plane is never opened without a key, and a
NetworkPolicy admits only the allowed peers to every worker pod (docs/deploy.md, "Keys" and
"Who reaches which port")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

OVERLAYS = ["cpu-demo", "gpu", "external-upstreams", "rl"]
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
SECRET = "maskgate-api-keys"
# Variables, flags and config fields that carry credentials.
KEYISH = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
KEY_FLAGS = ("--api-key", "--admin-api-key", "--admin-key", "--upstream-api-key")
CONFIG_KEY_FIELDS = {
    "api_keys",
    "mask_allow_keys",
    "admin_key",
    "upstream_api_key",
    "upstream_admin_api_key",
}
# The gateway variables that must come from the Secret, and the Secret key each reads.
GATEWAY_KEYS = {
    "MASKGATE_API_KEYS": "api-keys",
    "MASKGATE_ADMIN_KEY": "admin-key",
    "MASKGATE_UPSTREAM_API_KEY": "upstream-api-key",
    "MASKGATE_UPSTREAM_ADMIN_API_KEY": "upstream-admin-api-key",
}
# A maskgate worker's keys: the same Secret keys the gateway sends upstream.
WORKER_KEYS = {
    "MASKGATE_WORKER_API_KEY": "upstream-api-key",
    "MASKGATE_WORKER_ADMIN_API_KEY": "upstream-admin-api-key",
}
LOOPBACK = {"127.0.0.0/8", "::1/128"}

# NetworkPolicy peers that may reach a worker pod. Pod selectors without a namespaceSelector
# select pods in the policy's own namespace.
GATEWAY_PEER = {
    "podSelector": {
        "matchLabels": {
            "app.kubernetes.io/name": "maskgate",
            "app.kubernetes.io/component": "gateway",
        }
    }
}
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
TRAINER_PEER = {"podSelector": {"matchLabels": {"maskgate.io/role": "trainer"}}}
TRAINED_POOL_PEER = {
    "podSelector": {
        "matchLabels": {
            "app.kubernetes.io/name": "maskgate",
            "app.kubernetes.io/component": "mask-worker",
        }
    }
}
# The weight-update group's sockets: ports the kernel picks from ip_local_port_range.
GROUP_PORTS = ("TCP", 32768, 60999)
HTTP = ("TCP", "http", None)

Doc = dict[str, Any]


def workloads(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in WORKLOADS]


def containers(workload: Doc) -> list[Doc]:
    spec = workload["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def is_gateway(workload: Doc) -> bool:
    return workload["metadata"]["name"] == "maskgate-gateway"


def is_maskgate_worker(workload: Doc) -> bool:
    return any(c["image"].split(":")[0].endswith("maskgate/worker") for c in containers(workload))


def secret_ref(var: Doc) -> Doc | None:
    return var.get("valueFrom", {}).get("secretKeyRef")


def env_refs(container: Doc) -> dict[str, Doc]:
    return {v["name"]: secret_ref(v) for v in container.get("env", []) if secret_ref(v)}


def walk_keys(node: Any) -> list[str]:
    """Every mapping key anywhere in a parsed YAML document."""
    if isinstance(node, dict):
        return [str(k) for k in node] + [k for v in node.values() for k in walk_keys(v)]
    if isinstance(node, list):
        return [k for v in node for k in walk_keys(v)]
    return []


def gateway_file_config(docs: list[Doc], kit) -> Doc:
    gw = kit.one(docs, "Deployment", "maskgate-gateway")
    volumes = {v["name"]: v for v in gw["spec"]["template"]["spec"]["volumes"]}
    cm = kit.one(docs, "ConfigMap", volumes["config"]["configMap"]["name"])
    return yaml.safe_load(cm["data"]["gateway.yaml"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_manifest_carries_a_key(overlay: str, render, kit) -> None:
    docs = render(f"overlays/{overlay}")
    # The Secret is created by the operator (create-secret.sh), never shipped.
    assert not kit.find(docs, "Secret")
    for workload in workloads(docs):
        name = workload["metadata"]["name"]
        for c in containers(workload):
            env = {v["name"]: v for v in c.get("env", [])}
            for var_name, var in env.items():
                if KEYISH.search(var_name):
                    assert "value" not in var and secret_ref(var), (
                        f"{name}: {var_name} must come from a secretKeyRef"
                    )
            argv = c.get("command", []) + c.get("args", [])
            for i, arg in enumerate(argv):
                flag = arg.split("=", 1)[0]
                if flag not in KEY_FLAGS:
                    continue
                value = arg.split("=", 1)[1] if "=" in arg else argv[i + 1]
                m = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value)
                # Only a reference the kubelet expands from a Secret-backed variable.
                assert m and secret_ref(env[m.group(1)]), f"{name}: {flag} {value!r}"
    # No config file holds a key, not even an empty one.
    for cm in kit.find(docs, "ConfigMap"):
        for text in cm.get("data", {}).values():
            found = CONFIG_KEY_FIELDS & set(walk_keys(yaml.safe_load(text)))
            assert not found, f"ConfigMap {cm['metadata']['name']} sets {found}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_key_comes_from_the_secret_and_is_required(overlay: str, render, kit) -> None:
    docs = render(f"overlays/{overlay}")
    gw = kit.one(docs, "Deployment", "maskgate-gateway")
    refs = env_refs(gw["spec"]["template"]["spec"]["containers"][0])
    for var, key in GATEWAY_KEYS.items():
        # Required: a pod whose Secret lacks the key never starts (no silent "no key").
        assert refs[var] == {"name": SECRET, "key": key}, var
    upstream = {
        refs["MASKGATE_UPSTREAM_API_KEY"]["key"],
        refs["MASKGATE_UPSTREAM_ADMIN_API_KEY"]["key"],
    }
    workers = [w for w in workloads(docs) if not is_gateway(w)]
    assert bool(workers) == (overlay != "external-upstreams")
    for workload in workers:
        name = workload["metadata"]["name"]
        c = workload["spec"]["template"]["spec"]["containers"][0]
        if is_maskgate_worker(workload):
            wrefs = env_refs(c)
            for var, key in WORKER_KEYS.items():
                assert wrefs.get(var) == {"name": SECRET, "key": key}, f"{name}: {var}"
        else:
            # An SGLang pod: the key the gateway sends, as --api-key from a Secret variable.
            argv = c.get("command", []) + c.get("args", [])
            var = argv[argv.index("--api-key") + 1].removeprefix("$(").removesuffix(")")
            assert env_refs(c)[var]["key"] in upstream, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_and_workers_start_with_the_created_secret(
    overlay: str, render, kit, secret, tmp_path: Path
) -> None:
    """Both processes load their config the way their container does, with the Secret that
    create-secret.sh makes: the gateway holds an admin key, and sends the workers' own keys."""
    from maskgate.gateway.config import GatewayConfig
    from maskgate.protocol.settings import load_settings
    from maskgate.worker.cli import build_worker_parser, worker_overrides
    from maskgate.worker.config import load_config

    docs = render(f"overlays/{overlay}")
    gw = kit.one(docs, "Deployment", "maskgate-gateway")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(gateway_file_config(docs, kit)))
    config = load_settings(
        GatewayConfig,
        file=path,
        env=kit.secret_env(gw["spec"]["template"]["spec"]["containers"][0], secret),
    )
    assert config.admin_key == secret["admin-key"]
    assert config.insecure_control is False
    assert set(config.trusted_networks) <= LOOPBACK
    assert config.upstream_api_key == secret["upstream-api-key"]
    assert config.upstream_admin_api_key == secret["upstream-admin-api-key"]
    for workload in filter(is_maskgate_worker, workloads(docs)):
        c = workload["spec"]["template"]["spec"]["containers"][0]
        args = build_worker_parser().parse_args(c["args"][1:])
        assert c["args"][0] == "worker"
        worker = load_config(overrides=worker_overrides(args), env=kit.secret_env(c, secret))
        assert worker.host == "0.0.0.0"  # Service traffic reaches the pod IP; keys guard it
        assert worker.api_key is not None and worker.admin_api_key is not None
        api_key, admin_key = (
            worker.api_key.get_secret_value(),
            worker.admin_api_key.get_secret_value(),
        )
        assert api_key == config.upstream_api_key
        assert admin_key == config.upstream_admin_api_key
        assert api_key != admin_key


def test_created_secret_has_fresh_distinct_keys(secret, make_secret) -> None:
    assert set(secret) == {"api-keys", "admin-key", "upstream-api-key", "upstream-admin-api-key"}
    client_keys = yaml.safe_load(secret["api-keys"])
    values = [*client_keys, *(v for k, v in secret.items() if k != "api-keys")]
    assert len(set(values)) == len(values) == 4
    assert all(re.fullmatch(r"[0-9a-f]{64}", v) for v in values)  # 32 random bytes each
    # A second run makes new keys: nothing is fixed in the script.
    again = make_secret()
    assert not set(again.values()) & set(secret.values())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_is_never_configured_insecure(overlay: str, render, kit) -> None:
    """No shipped overlay opens the control plane without a key: no insecure_control, no
    trusted network beyond loopback, in the file, the environment or the flags."""
    docs = render(f"overlays/{overlay}")
    file_config = gateway_file_config(docs, kit)
    assert file_config.get("insecure_control", False) is False
    assert set(file_config.get("trusted_networks", [])) <= LOOPBACK
    assert file_config["host"] == "0.0.0.0"  # so the admin key is what guards control
    c = kit.one(docs, "Deployment", "maskgate-gateway")["spec"]["template"]["spec"]["containers"][0]
    names = {v["name"] for v in c.get("env", [])}
    assert not names & {"MASKGATE_INSECURE_CONTROL", "MASKGATE_TRUSTED_NETWORKS"}
    assert not [a for a in c.get("args", []) if "insecure" in a or "trusted-network" in a]


def ingress_policies(docs: list[Doc], workload: Doc, kit) -> list[Doc]:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return [
        p
        for p in kit.find(docs, "NetworkPolicy")
        if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and kit.selects(p["spec"]["podSelector"], labels)
    ]


def rule_ports(rule: Doc) -> set[tuple[str, Any, Any]]:
    assert rule.get("ports"), "a rule without ports opens every port"
    return {(p.get("protocol", "TCP"), p["port"], p.get("endPort")) for p in rule["ports"]}


def admitted(policies: list[Doc]) -> dict[tuple[str, Any, Any], list[Doc]]:
    """Port -> peers admitted to it, over all rules of all the pod's policies."""
    out: dict[tuple[str, Any, Any], list[Doc]] = {}
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            for port in rule_ports(rule):
                out.setdefault(port, []).extend(peers if peers else [{"anyone": True}])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_worker_pods_admit_only_the_allowed_peers(overlay: str, render, kit) -> None:
    docs = render(f"overlays/{overlay}")
    allowed = {HTTP: [GATEWAY_PEER, PROMETHEUS_PEER]}
    if overlay == "rl":
        allowed[HTTP].append(TRAINER_PEER)
        allowed[GROUP_PORTS] = [TRAINER_PEER, TRAINED_POOL_PEER]
    for workload in workloads(docs):
        if is_gateway(workload):
            continue
        name = workload["metadata"]["name"]
        policies = ingress_policies(docs, workload, kit)
        assert policies, f"{name}: no NetworkPolicy selects its pods (ingress open to all)"
        ports = admitted(policies)
        for port, peers in ports.items():
            assert port in allowed, f"{name}: port {port} is open"
            for peer in peers:
                assert peer in allowed[port], f"{name}: {peer} may reach {port}"
        # ...and the gateway does get through, or the pool is unreachable.
        assert GATEWAY_PEER in ports[HTTP], name
        # Named ports resolve to a port of the pod.
        names = {p["name"] for c in containers(workload) for p in c.get("ports", [])}
        assert all(isinstance(p, int) or p in names for _, p, _ in ports), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_ports_are_reachable_only_as_configured(overlay: str, render, kit) -> None:
    docs = render(f"overlays/{overlay}")
    gw = kit.one(docs, "Deployment", "maskgate-gateway")
    ports = admitted(ingress_policies(docs, gw, kit))
    # /metrics and the probes' port: Prometheus only (the kubelet is always let through).
    assert ports.pop(("TCP", "metrics", None)) == [PROMETHEUS_PEER]
    # The traffic port, where the control routes need the admin key: the trainer's pods in
    # the rl overlay; any client elsewhere (client routes need a client key).
    expected = [TRAINER_PEER] if overlay == "rl" else [{"anyone": True}]
    assert ports == {HTTP: expected}


def test_rl_overlay_runs_one_gateway_in_front_of_the_trained_pool(render, kit, tmp_path) -> None:
    from maskgate.gateway.config import GatewayConfig
    from maskgate.gateway.processes.cores import process_count
    from maskgate.protocol.settings import load_settings

    docs = render("overlays/rl")
    gw = kit.one(docs, "Deployment", "maskgate-gateway")
    assert gw["spec"]["replicas"] == 1
    assert gw["spec"]["strategy"] == {"type": "Recreate"}  # never two gateways at once
    assert not kit.find(docs, "HorizontalPodAutoscaler")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(gateway_file_config(docs, kit)))
    config = load_settings(GatewayConfig, file=path)
    assert process_count(config) == 1
    trained = getattr(config.pools, config.control.trained_pool)
    assert trained.dns and trained.dns.split(".")[0] == "maskgate-mask-workers"
    assert config.pools.general.dns is None and not config.pools.general.endpoints
    # The group ports the NetworkPolicy admits are the ones the workers' kernel hands out.
    workers = kit.one(docs, "Deployment", "maskgate-mask-workers")["spec"]["template"]["spec"]
    sysctls = {s["name"]: s["value"] for s in workers["securityContext"]["sysctls"]}
    low, high = (int(x) for x in sysctls["net.ipv4.ip_local_port_range"].split())
    assert (low, high) == GROUP_PORTS[1:]
    assert not workers.get("hostNetwork")

"""The alerts and the dashboard: `promtool check rules`, `promtool test rules` on synthetic
series, the dashboard's PromQL parsed by promtool too, and the panels the issue lists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

ALERTS = {
    "MaskgateNoHealthyMaskEndpoint",
    "MaskgateRejectionSpike",
    "MaskgateQueueSaturated",
    "MaskgateHighOverheadP99",
    "MaskgateMaskOverflowRate",
    "MaskgateSamplerFallbackRate",
    "MaskgateUpstreamErrorRate",
    "MaskgateMaskInvariantViolation",
    "MaskgateWeightSyncFailed",
}
# Dashboard panels the operator docs point at, by title.
PANELS = {
    "Traffic by pool",
    "Rejections by code",
    "Request duration percentiles",
    "Gateway overhead percentiles",
    "Queue depth and in-flight",
    "Queue wait",
    "Endpoint health",
    "Circuit state",
    "Mask support size",
    "Batch size",
    "Tokens/s",
    "KV cache usage",
    "Sampler fallback rows",
    "Engine step time and device wait",
    "Weight sync duration",
    "Endpoint weight versions",
}
# Grafana's template variables, replaced by plain values so promtool can parse the queries.
GRAFANA_VARS = {"$__rate_interval": "1m", "$namespace": ".*", "$pool": ".*"}


def promtool_run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def rules_dir(tmp_path: Path, rule_groups: dict[str, Any], kit) -> Path:
    """A folder holding rules.yaml (the PrometheusRule's spec) and the promtool unit tests."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups, sort_keys=False))
    shutil.copy(kit.RULE_TESTS, tmp_path / "rules-test.yaml")
    return tmp_path


def test_rules_pass_promtool_check(promtool: str, rules_dir: Path) -> None:
    proc = promtool_run(promtool, "check", "rules", "rules.yaml", cwd=rules_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout


def test_rules_pass_promtool_unit_tests(promtool: str, rules_dir: Path) -> None:
    proc = promtool_run(promtool, "test", "rules", "rules-test.yaml", cwd=rules_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_defined_and_unit_tested(rule_groups: dict[str, Any], kit) -> None:
    rules = [r for g in rule_groups["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    tests = yaml.safe_load(kit.RULE_TESTS.read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t["alert_rule_test"]}
    fired = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]
    }
    assert tested == fired == ALERTS, "every alert needs a test case in which it fires"


def test_dashboard_has_the_listed_panels_and_sound_layout(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    titles = {p["title"] for p in panels}
    assert titles >= PANELS, f"missing panels: {PANELS - titles}"
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    heatmaps = [p for p in panels if p["type"] == "heatmap"]
    assert [p["title"] for p in heatmaps] == ["Mask support size"]
    assert heatmaps[0]["targets"][0]["format"] == "heatmap"
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "pool"} <= names


def test_dashboard_queries_parse(
    promtool: str, dashboard: dict[str, Any], kit, tmp_path: Path
) -> None:
    # promtool has no "check this expression" command, so every query becomes a recording rule.
    rules = []
    for i, (title, expr) in enumerate(kit.dashboard_exprs(dashboard)):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{title}: unknown Grafana variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    (tmp_path / "dash.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    proc = promtool_run(promtool, "check", "rules", "dash.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_and_dashboard_use_only_the_contracts_metric_names(
    rule_groups: dict[str, Any], dashboard: dict[str, Any], kit
) -> None:
    """A cheap guard that needs no running process: every name is `maskgate_*` and well formed.
    test_deploy_metrics.py checks each one against what the gateway and worker really export."""
    exprs = kit.rule_exprs(rule_groups) + kit.dashboard_exprs(dashboard)
    for title, expr in exprs:
        names = kit.metric_names(expr)
        assert names, f"{title}: queries no maskgate metric"
        for name in names:
            assert re.fullmatch(r"maskgate_[a-z0-9_]+[a-z0-9]", name), name

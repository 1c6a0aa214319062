"""The mask policy's rule list (`RULES`, protocol/rules.py) is the rule table of
docs/design.md (Policy), row for row: the same numbers, in the same order, with the same codes."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from maskgate.protocol.errors import PolicyError
from maskgate.protocol.policy import POLICY_CODES, PolicyConfig, Route, check_mask_request
from maskgate.protocol.rules import RULES, Rule, _steps

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def table_rows() -> list[tuple[str, tuple[str, ...]]]:
    """(number, codes) of every row of the table under '## Policy'."""
    text = DESIGN.read_text()
    section = text.split("## Policy", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"\d+[a-z]?", cells[0]):
            rows.append((cells[0], tuple(re.findall(r"`([a-z_]+)`", cells[4]))))
    return rows


def test_rules_match_the_design_table_in_order() -> None:
    rows = table_rows()
    assert len(rows) >= 11
    assert [(r.number, r.codes) for r in RULES] == rows


def test_policy_codes_are_the_codes_of_the_rules() -> None:
    assert {code for _, codes in table_rows() for code in codes} == POLICY_CODES


def test_every_rule_is_checked_somewhere() -> None:
    for rule in RULES:
        checks = [c for c in (rule.view, rule.item) if c is not None]
        assert len(checks) == 1 or (not checks and rule.applied_by != "check_view"), rule


def test_consecutive_item_rules_run_item_by_item() -> None:
    """Rules 7 and 8 are one step: on a batch, item 0 breaking rule 8 answers before item 1
    breaking rule 7."""
    order: list[str] = []
    view_rule = Rule("x", (), view=lambda view: order.append("view"))
    item_a = Rule("a", (), item=lambda view, item: order.append(f"a{item.where}"))
    item_b = Rule("b", (), item=lambda view, item: order.append(f"b{item.where}"))

    view = SimpleNamespace(
        items=[
            SimpleNamespace(where=w, masked=m) for w, m in (("0", True), ("1", False), ("2", True))
        ]
    )
    for step in _steps((item_a, item_b, view_rule, item_a)):
        step(view)  # type: ignore[arg-type]
    assert order == ["a0", "b0", "a2", "b2", "view", "a0", "a2"]
    body = {
        "text": ["a", "b"],
        "return_sampling_mask": True,
        "sampling_params": [{"top_k": 5000}, {"top_k": -1, "top_p": 1.0}],
    }
    with pytest.raises(PolicyError) as e:
        check_mask_request(Route.GENERATE, body, PolicyConfig())
    assert (e.value.code, e.value.param) == (
        "sampling_mask_top_k_exceeds_cap",
        "sampling_params[0].top_k",
    )

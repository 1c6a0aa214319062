"""The README opens with exactly two set-up commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    head = text.split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", head, flags=re.S)]


def test_readme_opens_with_two_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    demo, tests = commands
    assert "maskgate up" in demo
    assert "pytest" in tests
    for command in commands:
        assert "torch==2.13.0" in command  # the CPU build; a looser pin downloads CUDA wheels


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci

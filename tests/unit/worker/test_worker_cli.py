"""The `maskgate` command: torch-free import, subcommand dispatch, the worker's config path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from maskgate.cli import main
from maskgate.protocol.settings import ConfigError
from maskgate.worker.config import load_config

REPO = Path(__file__).resolve().parents[3]


def test_importing_the_cli_loads_no_torch() -> None:
    # `maskgate gateway` must run in the gateway image, which has no torch.
    code = "import sys, maskgate.cli; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_usage_and_unknown_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "gateway" in capsys.readouterr().out
    assert main(["--help"]) == 0
    assert main(["serve"]) == 2
    assert "unknown command 'serve'" in capsys.readouterr().err


def test_worker_config_file_env_and_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "worker.yaml"
    cfg.write_text("model: smollm2\nmax_num_seqs: 8\nport: 9000\n")
    monkeypatch.setenv("MASKGATE_WORKER_MAX_NUM_SEQS", "12")
    monkeypatch.setenv("MASKGATE_WORKER_ROLE", "mask")
    assert main(["worker", "--config", str(cfg), "--port", "9100", "--check-config"]) == 0
    got = json.loads(capsys.readouterr().out)
    # file < environment < flags
    assert (got["model"], got["max_num_seqs"], got["role"], got["port"]) == (
        "smollm2",
        12,
        "mask",
        9100,
    )


def test_bad_worker_config_names_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--max-num-seqs", "0", "--check-config"]) == 2
    assert "max_num_seqs" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="max_mask_tokns"):
        load_config(overrides={"max_mask_tokns": 5}, env={})


def test_fused_kernels_switch_from_file_env_and_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_config(env={}).fused_kernels is True  # the CUDA default
    cfg = tmp_path / "worker.yaml"
    cfg.write_text("fused_kernels: false\n")
    assert load_config(file=cfg, env={}).fused_kernels is False
    # file < environment
    env = {"MASKGATE_WORKER_FUSED_KERNELS": "true"}
    assert load_config(file=cfg, env=env).fused_kernels is True
    # environment < flag
    monkeypatch.setenv("MASKGATE_WORKER_FUSED_KERNELS", "true")
    assert main(["worker", "--no-fused-kernels", "--check-config"]) == 0
    assert json.loads(capsys.readouterr().out)["fused_kernels"] is False
    # a typed key: a value that is no bool names the field
    with pytest.raises(ConfigError, match="fused_kernels"):
        load_config(env={"MASKGATE_WORKER_FUSED_KERNELS": "sometimes"})


def runner_arguments(monkeypatch: pytest.MonkeyPatch, setting: str, argument: str) -> list[object]:
    """The ModelRunner keyword `argument` that load_backend passes for the worker setting
    `setting` set to False, then True (a CPU runner of the tiny model each time)."""
    from maskgate.worker.runner import runner
    from maskgate.worker.server.backend import load_backend

    seen: list[object] = []
    real = runner.ModelRunner

    def recording_runner(*args: object, **kw: object) -> object:
        seen.append(kw.get(argument))
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "ModelRunner", recording_runner)
    for flag in (False, True):
        config = load_config(
            overrides={"device": "cpu", setting: flag, "max_model_len": 64}, env={}
        )
        load_backend(config)
    return seen


def test_fused_kernels_reaches_the_model_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runner_arguments(monkeypatch, "fused_kernels", "fused_kernels") == [False, True]


def test_warm_up_only_loads_the_model_and_exits(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level("INFO", logger="maskgate.worker")
    argv = ["worker", "--model", "tiny-random", "--device", "cpu", "--max-model-len", "64"]
    assert main([*argv, "--warm-up-only"]) == 0
    assert "warm-up done" in caplog.text and "exiting without serving" in caplog.text
    # The action is no config key: it never reaches the config or --check-config's output.
    capsys.readouterr()
    assert main([*argv, "--warm-up-only", "--check-config"]) == 0
    assert "warm_up" not in capsys.readouterr().out
    assert main(["worker", "--model", "/nonexistent/model", "--warm-up-only"]) == 1
    assert "warm-up failed" in caplog.text

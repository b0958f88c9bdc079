"""The command line: demo, train from a config with flag overrides, help."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from trainwright.app.cli import main


def test_help_and_unknown_command(capsys):
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2


def test_demo_runs_a_real_short_training(tmp_path):
    from trainwright.app.demo import run_demo

    summary = run_demo(
        output_dir=str(tmp_path / "demo"), max_steps=30, eval_steps=30, save_steps=30, logging_steps=10
    )
    assert summary["steps"] == 30
    assert summary["eval_loss_after"] < summary["eval_loss_before"] - 1.0  # bytes: ~5.5 -> clearly lower
    for name in (
        "model.safetensors",
        "trainer_state.json",
        "all_results.json",
        "logs.jsonl",
        "checkpoint-30",
    ):
        assert os.path.exists(os.path.join(tmp_path, "demo", name)), name


def test_train_command_from_yaml_with_flag_override(tmp_path):
    text = "the quick brown fox jumps over the lazy dog. " * 200
    (tmp_path / "train.txt").write_text(text)
    with open(tmp_path / "valid.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"text": f"the lazy dog number {i} sleeps. " * 3}) + "\n")
    config = {
        "model_type": "tinygpt",
        "model_config": {"n_layer": 1, "n_embd": 32, "n_head": 2, "dropout": 0.0},
        "train_file": str(tmp_path / "train.txt"),
        "validation_file": str(tmp_path / "valid.jsonl"),
        "block_size": 32,
        "output_dir": str(tmp_path / "run"),
        "max_steps": 100,
        "per_device_train_batch_size": 8,
        "learning_rate": 3e-3,
        "report_to": "none",
        "disable_tqdm": True,
        "save_strategy": "no",
        "use_cpu": True,
    }
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "trainwright", "train", str(cfg_path), "--max_steps", "12"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "run" / "all_results.json") as f:
        results = json.load(f)
    assert "eval_loss" in results and "train_loss" in results
    with open(tmp_path / "run" / "trainer_state.json") as f:
        assert json.load(f)["global_step"] == 12  # the flag overrode the file's 100


def test_train_command_reports_a_missing_file(tmp_path):
    from trainwright.app.train_script import run_train

    with pytest.raises(FileNotFoundError, match="nope.txt"):
        run_train(
            [
                "--train_file",
                str(tmp_path / "nope.txt"),
                "--output_dir",
                str(tmp_path / "o"),
                "--report_to",
                "none",
                "--use_cpu",
            ]
        )

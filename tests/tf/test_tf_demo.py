"""`trainwright demo --framework tf`: trains a small Keras model offline and writes its files."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("tensorflow")

from trainwright.app.cli import main  # noqa: E402


def test_demo_framework_tf(tmp_path, capsys):
    out = str(tmp_path / "demo")
    assert main(["demo", "--framework", "tf", "--output_dir", out, "--max_steps", "60"]) == 0
    results = json.load(open(os.path.join(out, "eval_results.json")))
    assert results["eval_accuracy"] > 0.8  # three spiral arms: chance is 1/3
    assert os.path.isfile(os.path.join(out, "model.weights.h5"))
    assert os.path.isdir(os.path.join(out, "checkpoint-60"))
    assert os.listdir(os.path.join(out, "runs"))  # TensorBoard event files
    assert "***** eval metrics *****" in capsys.readouterr().out

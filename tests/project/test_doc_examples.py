"""The code a newcomer copies runs as written: the README's quick start (twice: the second run resumes
from the newest checkpoint) and each script of docs/examples.md, extracted from the files themselves
and run in a fresh process in an empty folder."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kit import ROOT


def python_blocks(path: Path, after: str | None = None) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if after is not None:
        text = text[text.index(after) :]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def run_script(code: str, cwd: Path) -> subprocess.CompletedProcess:
    script = cwd / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_readme_quick_start_runs_as_written_and_resumes(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    code = python_blocks(ROOT / "README.md", after="## Quick start")[0]
    assert "get_last_checkpoint" in code and "train_ds" in code
    first = run_script(code, tmp_path)
    assert "Training: 60 steps (starting at step 0)" in first.stdout
    final = ast.literal_eval(first.stdout.strip().splitlines()[-1])  # print(trainer.evaluate()): a dict
    assert final["eval_loss"] < 1.0  # it learned to count (ln 64 = 4.16 at the start)
    state = json.loads((tmp_path / "out" / "checkpoint-60" / "trainer_state.json").read_text())
    assert state["global_step"] == 60
    assert list((tmp_path / "out" / "runs").glob("*/events.out.tfevents.*"))
    assert (tmp_path / "out" / "model.safetensors").is_file()
    if importlib.util.find_spec("matplotlib") is not None:  # the README's `trainwright plot out`
        plot = subprocess.run(
            [sys.executable, "-m", "trainwright", "plot", "out"], cwd=tmp_path, capture_output=True, text=True
        )
        assert plot.returncode == 0, plot.stderr[-3000:]  # out has no trainer_state.json: checkpoint-60's
        assert (tmp_path / "out" / "plot_loss.png").is_file()
        assert not list((tmp_path / "out").glob("checkpoint-*/*.png"))
    second = run_script(code, tmp_path)  # resumes from checkpoint-60: nothing left to train
    assert "Training: 60 steps (starting at step 60)" in second.stdout


def test_docs_examples_run_as_written(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("optuna")
    speed, search, part = python_blocks(ROOT / "docs" / "examples.md")
    (tmp_path / "speed").mkdir()
    out = run_script(speed, tmp_path / "speed").stdout
    assert re.search(r"^\d+ tokens/s, [\d.e+]+ FLOP/s$", out, flags=re.M), out[-2000:]
    (tmp_path / "search").mkdir()
    out = run_script(search, tmp_path / "search").stdout
    params, _, objective = out.strip().splitlines()[-1].rpartition("} ")
    assert set(ast.literal_eval(params + "}")) == {"learning_rate", "weight_decay"} and float(objective) < 4.2
    (tmp_path / "part").mkdir()
    out = run_script(part, tmp_path / "part").stdout
    assert out.strip().splitlines()[-1] == "EMA after a resume equals the whole run's: True"
    assert (tmp_path / "part" / "stopped" / "checkpoint-3" / "ema.pt").is_file()

"""Off a terminal (nohup, CI, Slurm) a run prints a plain progress line at a steady interval, as the
bar does on one: step, percent, rate and time left. A real subprocess whose output is a pipe."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import RegressionDataset, RegressionModel
from kit import TESTS

from trainwright import ProgressCallback, Trainer

SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from conftest import RegressionDataset, RegressionModel
    from trainwright import Trainer, TrainerCallback, TrainingArguments

    class Slow(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            time.sleep(0.05)

    args = TrainingArguments(output_dir={out!r}, max_steps=30, logging_steps=1000, per_device_train_batch_size=2,
                             report_to="none", use_cpu=True, save_strategy="no")
    Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(), callbacks=[Slow()]).train()
    """
)


def test_a_run_off_a_terminal_prints_progress_lines_at_a_steady_interval(tmp_path):
    code = SCRIPT.format(tests=str(TESTS), out=str(tmp_path / "out"))
    env = {**os.environ, "TRAINWRIGHT_PROGRESS_EVERY": "0.3"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [
        line
        for line in done.stdout.splitlines()
        if re.fullmatch(r"\[\d+/30\] \d+% [\d.]+ steps/s, about \S+ left", line)
    ]
    assert len(lines) >= 3, done.stdout  # 30 steps of >= 50 ms, a line every 0.3 s
    steps = [int(line[1:].split("/")[0]) for line in lines]
    assert steps == sorted(steps) and steps[-1] < 30
    assert "\r" not in done.stdout and "it/s" not in done.stderr  # no bar


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf", ""])
def test_a_progress_interval_that_is_no_positive_number_is_refused_naming_the_variable(
    make_args, monkeypatch, value
):
    # each of these printed no progress line at all (or raised float()'s bare ValueError)
    monkeypatch.setenv("TRAINWRIGHT_PROGRESS_EVERY", value)
    with pytest.raises(ValueError) as e:
        Trainer(
            model=RegressionModel(), args=make_args(disable_tqdm=False), train_dataset=RegressionDataset()
        )
    assert str(e.value).startswith(f"TRAINWRIGHT_PROGRESS_EVERY={value!r} is invalid")
    assert "a number > 0" in str(e.value) and "'off'" in str(e.value)


def test_off_turns_the_progress_lines_off_and_a_number_sets_the_interval(make_args, monkeypatch):
    def interval() -> float:
        trainer = Trainer(
            model=RegressionModel(), args=make_args(disable_tqdm=False), train_dataset=RegressionDataset()
        )
        (progress,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ProgressCallback)]
        return progress.every

    monkeypatch.setenv("TRAINWRIGHT_PROGRESS_EVERY", "off")
    assert interval() == 0
    monkeypatch.setenv("TRAINWRIGHT_PROGRESS_EVERY", "2.5")
    assert interval() == 2.5
    monkeypatch.delenv("TRAINWRIGHT_PROGRESS_EVERY")
    assert interval() == 30
    with pytest.raises(ValueError, match=r"ProgressCallback: every=-1 is invalid"):
        ProgressCallback(every=-1)

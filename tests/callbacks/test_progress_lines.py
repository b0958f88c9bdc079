"""Off a terminal (nohup, CI, Slurm) a run prints a plain progress line at a steady interval, as the
bar does on one: step, percent, rate and time left. A real subprocess whose output is a pipe."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

from kit import TESTS

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

"""`trainwright demo` attaches a SpeedMonitor whose window is full at the first log row, so every
training row carries throughput and the throughput plot is a curve."""

from __future__ import annotations

import importlib.util
import json
import os

from trainwright.app.demo import run_demo, speed_window


def test_every_training_row_of_the_demo_has_throughput(tmp_path):
    out = tmp_path / "demo"
    summary = run_demo(output_dir=str(out), max_steps=12, logging_steps=4, eval_steps=12, save_steps=12)
    with open(out / "trainer_state.json") as f:
        history = json.load(f)["log_history"]
    rows = [r for r in history if "loss" in r]
    assert [r["step"] for r in rows] == [4, 8, 12]
    for row in rows:  # window of 3 steps: full (4 step ends) at step 4 already
        assert row["throughput/samples_per_sec"] > 0 and row["throughput/tokens_per_sec"] > 0
        assert row["throughput/batches_per_sec"] > 0 and row["time/train"] > 0
    assert summary["throughput"]["throughput/tokens_per_sec"] == rows[-1]["throughput/tokens_per_sec"]
    if importlib.util.find_spec("matplotlib") is not None:  # the plot extra
        assert "plot_throughput.png" in [os.path.basename(p) for p in summary["plots"]]


def test_speed_window_fits_the_logging_interval():
    class Args:
        max_steps = 600
        logging_steps = 50

    assert speed_window(Args) == 49
    Args.logging_steps = 0.1  # a ratio of max_steps: every 60 steps
    assert speed_window(Args) == 59
    Args.logging_steps = 1
    assert speed_window(Args) == 1  # the smallest window; rates from the second row

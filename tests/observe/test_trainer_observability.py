"""Memory report and SpeedMonitor through a real Trainer run."""

from __future__ import annotations

import pytest
from conftest import DropoutMLP, RegressionDataset, RegressionModel, VectorDataset
from observe_kit import touched_buffer

from trainwright import SpeedMonitor, Trainer, TrainerCallback

MB = 1 << 20


class BigTemporary(TrainerCallback):
    """Allocates (and frees) a 300 MB buffer in the middle of training."""

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 2:
            buf = touched_buffer(300 * MB)
            del buf


def test_memory_report_catches_a_temporary_peak_and_ignores_nested_eval(make_args):
    args = make_args(max_steps=4, skip_memory_metrics=False, eval_strategy="steps", eval_steps=2)
    trainer = Trainer(
        model=RegressionModel(),
        args=args,
        train_dataset=RegressionDataset(),
        eval_dataset=RegressionDataset(length=16),
        callbacks=[BigTemporary()],
    )
    out = trainer.train()
    m = out.metrics
    for key in (
        "init_mem_cpu_alloc_delta",
        "init_mem_cpu_peaked_delta",
        "before_init_mem_cpu",
        "train_mem_cpu_alloc_delta",
        "train_mem_cpu_peaked_delta",
    ):
        assert key in m, key
    assert m["train_mem_cpu_peaked_delta"] == pytest.approx(300 * MB, rel=0.05)
    evals = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert evals and not any("eval_mem_cpu_alloc_delta" in r for r in evals)  # nested in train: not tracked
    standalone = trainer.evaluate()
    assert "eval_mem_cpu_alloc_delta" in standalone and "init_mem_cpu_alloc_delta" not in standalone


def test_speed_monitor_logs_throughput_with_the_training_rows(make_args, capsys):
    args = make_args(max_steps=6, logging_steps=3)  # disable_tqdm: PrinterCallback prints each row
    trainer = Trainer(
        model=DropoutMLP(),
        args=args,
        train_dataset=VectorDataset(),
        callbacks=[SpeedMonitor(window_size=4, gpu_flops_available=1e12)],
    )
    trainer.train()
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert len(rows) == 2
    for key in (
        "throughput/batches_per_sec",
        "throughput/samples_per_sec",
        "throughput/flops_per_sec",
        "throughput/device/mfu",
        "time/train",
        "time/total",
    ):
        assert key in rows[-1], key
    # one process: the per-device rates equal the totals and are logged all the same, so a run's keys
    # (a dashboard's) are those of a run on several processes; only the console line leaves them out
    for name in ("batches", "samples", "flops"):
        assert rows[-1][f"throughput/device/{name}_per_sec"] == rows[-1][f"throughput/{name}_per_sec"]
    printed = [line for line in capsys.readouterr().out.splitlines() if "throughput/" in line]
    assert len(printed) == 1 and "'throughput/samples_per_sec'" in printed[-1]  # a full window
    assert "throughput/device/mfu" in printed[-1] and "device/samples_per_sec" not in printed[-1]
    assert rows[-1]["throughput/samples_per_sec"] > 0
    assert trainer.state.total_flos > 0

"""metrics.py: result types, formatting, metric files, and speed metrics."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trainwright.core.state import TrainerState
from trainwright.observe import metrics as M
from trainwright.observe.metrics import (
    BestRun,
    EvalLoopOutput,
    EvalPrediction,
    PredictionOutput,
    TrainOutput,
    denumpify_detensorize,
    log_metrics,
    metrics_format,
    save_metrics,
    save_state,
    speed_metrics,
)

SAMPLE = {
    "train_runtime": 3725.456,
    "train_loss": 0.123456789,
    "total_flos": 3 * 2**30 + 5,
    "train_mem_cpu_alloc_delta": 5 * 2**20 + 3,
    "train_mem_gpu_peaked_delta": -(2**21),
    "epoch": 2.0,
    "train_samples_per_second": 12.345,
    "step": 7,
    "name": "x",
}


# -- result types --------------------------------------------------------------------------


def test_result_namedtuples_fields_and_defaults():
    assert TrainOutput(3, 0.5, {"a": 1}).training_loss == 0.5
    assert EvalLoopOutput._fields == ("predictions", "label_ids", "metrics", "num_samples")
    assert PredictionOutput._fields == ("predictions", "label_ids", "metrics")
    run = BestRun("1", 0.3, {"lr": 1e-3})
    assert run.run_summary is None and run.hyperparameters == {"lr": 1e-3}


def test_eval_prediction_unpacks_non_none_fields():
    preds, labels = EvalPrediction(np.zeros(2), np.ones(2))
    assert preds.sum() == 0 and labels.sum() == 2

    p = EvalPrediction("p", "l", losses="loss")
    assert len(p) == 3 and tuple(p) == ("p", "l", "loss")
    assert p[2] == "loss" and p.inputs is None and p.losses == "loss"
    with pytest.raises(IndexError):
        p[3]
    full = EvalPrediction("p", "l", inputs="i", losses="x")
    assert tuple(full) == ("p", "l", "i", "x")
    assert "predictions" in repr(full)


# -- speed metrics -------------------------------------------------------------------------


def test_speed_metrics_rounding(monkeypatch):
    monkeypatch.setattr(M, "time", SimpleNamespace(time=lambda: 103.0))
    out = speed_metrics("train", 100.0 - 0.123456, num_samples=10, num_steps=7, num_tokens=1000)
    assert out == {
        "train_runtime": 3.1235,  # 3.123456 s
        "train_samples_per_second": 3.202,  # 3.20158...
        "train_steps_per_second": 2.241,  # 2.24110...
        "train_tokens_per_second": 320.158,  # 320.1581...
    }
    assert list(speed_metrics("eval", 100.0, num_samples=4)) == ["eval_runtime", "eval_samples_per_second"]


def test_speed_metrics_zero_runtime_omits_rates(monkeypatch):
    monkeypatch.setattr(M, "time", SimpleNamespace(time=lambda: 50.0))
    assert speed_metrics("eval", 50.0, num_samples=5, num_steps=2) == {"eval_runtime": 0.0}


def test_speed_metrics_real_clock():
    out = speed_metrics("test", time.time() - 2.0, num_samples=4)
    assert out["test_runtime"] >= 2.0 and 0 < out["test_samples_per_second"] <= 2.0


def test_denumpify_detensorize():
    out = denumpify_detensorize(
        {"a": np.float32(0.5), "b": [np.int64(3), torch.tensor(2.5)], "c": (torch.tensor([1]),), "d": "s"}
    )
    assert out == {"a": 0.5, "b": [3, 2.5], "c": (1,), "d": "s"}
    assert type(out["a"]) is float and type(out["b"][0]) is int
    big = torch.arange(3)
    assert denumpify_detensorize(big) is big


# -- formatting ----------------------------------------------------------------------------


def test_metrics_format_exact_strings():
    out = metrics_format(SAMPLE)
    assert out == {
        "train_runtime": "1:02:05.45",
        "train_loss": 0.1235,
        "total_flos": "3GF",
        "train_mem_cpu_alloc_delta": "5MB",
        "train_mem_gpu_peaked_delta": "-2MB",
        "epoch": 2.0,
        "train_samples_per_second": 12.345,
        "step": 7,
        "name": "x",
    }
    assert SAMPLE["train_runtime"] == 3725.456  # input untouched


@pytest.mark.parametrize(
    "seconds, text",
    [(0.29, "0:00:00.29"), (59.999, "0:00:59.99"), (90061.5, "1 day, 1:01:01.50"), (-1.5, "-0:00:01.50")],
)
def test_runtime_format(seconds, text):
    assert metrics_format({"eval_runtime": seconds})["eval_runtime"] == text


def test_log_metrics_layout():
    lines: list[str] = []
    log_metrics("train", SAMPLE, print_fn=lines.append)
    assert lines == [
        "***** train metrics *****",
        "  epoch                      =        2.0",
        "  name                       =          x",
        "  step                       =          7",
        "  total_flos                 =        3GF",
        "  train_loss                 =     0.1235",
        "  train_mem_cpu_alloc_delta  =        5MB",
        "  train_mem_gpu_peaked_delta =       -2MB",
        "  train_runtime              = 1:02:05.45",
        "  train_samples_per_second   =     12.345",
    ]


def test_log_metrics_prints_by_default_and_only_on_main(capsys):
    log_metrics("eval", {"eval_loss": 1.0})
    assert capsys.readouterr().out == "***** eval metrics *****\n  eval_loss = 1.0\n"
    log_metrics("eval", {"eval_loss": 1.0}, is_world_process_zero=False)
    assert capsys.readouterr().out == ""


# -- files ---------------------------------------------------------------------------------


def test_save_metrics_writes_split_file_and_merges(tmp_path):
    save_metrics(tmp_path, "train", {"train_loss": 0.5, "epoch": np.float64(1.0)})
    save_metrics(tmp_path, "eval", {"eval_loss": 0.25, "epoch": 2.0})
    text = (tmp_path / "train_results.json").read_text()
    assert text == json.dumps({"epoch": 1.0, "train_loss": 0.5}, indent=4, sort_keys=True)
    assert json.loads((tmp_path / "eval_results.json").read_text()) == {"eval_loss": 0.25, "epoch": 2.0}
    assert json.loads((tmp_path / "all_results.json").read_text()) == {
        "train_loss": 0.5,
        "eval_loss": 0.25,
        "epoch": 2.0,
    }
    save_metrics(tmp_path, "test", {"test_loss": 0.1}, combined=False)
    assert "test_loss" not in json.loads((tmp_path / "all_results.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "all_results.json",
        "eval_results.json",
        "test_results.json",
        "train_results.json",
    ]  # no temporary files left behind


def test_save_metrics_rank_nonzero_and_bad_all_results(tmp_path):
    save_metrics(tmp_path / "out", "train", {"a": 1}, is_world_process_zero=False)
    assert not (tmp_path / "out").exists()
    (tmp_path / "all_results.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="all_results.json must hold a JSON object"):
        save_metrics(tmp_path, "train", {"a": 1})
    with pytest.raises(ValueError, match=r"cannot write preds \(Tensor\)"):
        save_metrics(tmp_path / "x", "eval", {"eval_loss": 1.0, "preds": torch.ones(3)})
    assert not (tmp_path / "x" / "eval_results.json").exists()


def test_save_state(tmp_path):
    state = TrainerState(global_step=12, best_metric=0.5, log_history=[{"loss": 1.0, "step": 12}])
    save_state(tmp_path / "run", state)
    loaded = TrainerState.load_from_json(str(tmp_path / "run" / "trainer_state.json"))
    assert loaded == state
    save_state(tmp_path / "other", state, is_world_process_zero=False)
    assert not (tmp_path / "other").exists()

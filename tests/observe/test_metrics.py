"""metrics.py: result types, formatting, metric files, speed metrics and evaluation accumulation."""

from __future__ import annotations

import json
import time
from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trainwright.core.state import TrainerState
from trainwright.observe import metrics as M
from trainwright.observe.metrics import (
    BestRun,
    EvalAccumulator,
    EvalLoopOutput,
    EvalPrediction,
    PredictionOutput,
    TrainOutput,
    denumpify_detensorize,
    log_metrics,
    metrics_format,
    nested_numpify,
    nested_truncate,
    pad_and_concatenate,
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


# -- padding and concatenation -------------------------------------------------------------


def test_pad_and_concatenate_variable_lengths_numpy():
    a = np.arange(6).reshape(2, 3)
    b = np.arange(10).reshape(2, 5) + 100
    c = np.ones((1, 2), dtype=np.int64)
    out = pad_and_concatenate([a, b, c])
    assert out.shape == (5, 5)
    np.testing.assert_array_equal(out[:2, :3], a)
    assert (out[:2, 3:] == -100).all()
    np.testing.assert_array_equal(out[2:4], b)
    np.testing.assert_array_equal(out[4], [1, 1, -100, -100, -100])


def test_pad_and_concatenate_pads_every_trailing_dim_and_promotes_dtype():
    a = np.zeros((1, 2, 4), dtype=np.float32)
    b = np.ones((2, 3, 1), dtype=np.float64)
    out = pad_and_concatenate([a, b], padding_index=-1)
    assert out.shape == (3, 3, 4) and out.dtype == np.float64
    assert (out[0, :2, :] == 0).all() and (out[0, 2, :] == -1).all()
    assert (out[1:, :, 0] == 1).all() and (out[1:, :, 1:] == -1).all()


def test_pad_and_concatenate_torch_keeps_tensors():
    a = torch.zeros(2, 3)
    b = torch.ones(1, 4)
    out = pad_and_concatenate([a, b])
    assert isinstance(out, torch.Tensor) and out.shape == (3, 4)
    assert out[0, 3] == -100 and out[2, 3] == 1
    same = pad_and_concatenate([torch.zeros(2, 3), torch.ones(1, 3)])
    assert same.shape == (3, 3) and same[2].sum() == 3
    scalars = pad_and_concatenate([torch.tensor(1.0), torch.tensor(2.0)])
    assert scalars.tolist() == [1.0, 2.0]


def test_pad_and_concatenate_nested_structures():
    Out = namedtuple("Out", "logits hidden")
    batches = [
        Out(np.zeros((2, 3)), {"h": np.zeros((2, 1)), "extra": None}),
        Out(np.ones((1, 5)), {"extra": None, "h": np.ones((1, 1))}),
    ]
    out = pad_and_concatenate(batches)
    assert isinstance(out, Out)
    assert out.logits.shape == (3, 5) and out.logits[0, 4] == -100 and out.logits[2, 4] == 1
    assert out.hidden["h"].shape == (3, 1) and out.hidden["extra"] is None
    lists = pad_and_concatenate([[np.zeros(2), np.zeros((2, 2))], [np.ones(1), np.ones((1, 3))]])
    assert isinstance(lists, list) and lists[0].shape == (3,) and lists[1].shape == (3, 3)


@pytest.mark.parametrize(
    "batches, error",
    [
        ([], "non-empty list"),
        ([(np.zeros(1),), (np.zeros(1), np.zeros(1))], "different structure"),
        ([{"a": np.zeros(1)}, {"b": np.zeros(1)}], "different keys"),
        ([np.zeros((1, 2)), np.zeros(3)], "numbers of dimensions"),
        ([np.zeros(1), None], "None"),
        ([np.zeros(1), torch.zeros(1)], "mix of torch tensors and numpy"),
    ],
)
def test_pad_and_concatenate_errors(batches, error):
    with pytest.raises((ValueError, TypeError), match=error):
        pad_and_concatenate(batches)


def test_nested_numpify_and_truncate():
    x = {"a": torch.ones(4, 2, dtype=torch.bfloat16), "b": (torch.zeros(4, dtype=torch.float16), None)}
    out = nested_numpify(x)
    assert out["a"].dtype == np.float32 and out["b"][0].dtype == np.float32 and out["b"][1] is None
    cut = nested_truncate(out, 3)
    assert cut["a"].shape == (3, 2) and cut["b"][0].shape == (3,) and cut["b"][1] is None
    assert nested_truncate(torch.arange(5), 2).tolist() == [0, 1]


# -- accumulator ---------------------------------------------------------------------------


def test_eval_accumulator_variable_lengths_and_nested():
    acc = EvalAccumulator()
    assert acc.get_arrays() is None
    acc.add(None)
    acc.add((torch.zeros(2, 3, dtype=torch.bfloat16), torch.tensor([1, 2])))
    acc.add((torch.ones(3, 6, requires_grad=True), torch.tensor([3, 4, 5])))
    assert len(acc) == 2
    logits, labels = acc.get_arrays()
    assert isinstance(logits, np.ndarray) and logits.shape == (5, 6) and logits.dtype == np.float32
    assert (logits[:2, 3:] == -100).all() and (logits[2:] == 1).all()
    assert labels.tolist() == [1, 2, 3, 4, 5]
    # Adding after reading keeps everything.
    acc.add((torch.full((1, 2), 7.0), torch.tensor([6])))
    logits, labels = acc.get_arrays()
    assert logits.shape == (6, 6) and labels.tolist() == [1, 2, 3, 4, 5, 6]
    assert logits[5, 0] == 7 and logits[5, 2] == -100


def test_eval_accumulator_single_scalar_chunk_and_no_concat():
    acc = EvalAccumulator()
    acc.add(torch.tensor(0.5))
    assert acc.get_arrays().tolist() == [0.5]
    listed = EvalAccumulator(do_concat=False)
    listed.add(torch.zeros(2, 3))
    listed.add(torch.zeros(1, 4))
    chunks = listed.get_arrays()
    assert [c.shape for c in chunks] == [(2, 3), (1, 4)]
    assert all(isinstance(c, np.ndarray) for c in chunks)


def test_eval_accumulator_concatenates_once(monkeypatch):
    calls = {"concatenate": 0, "pad": 0}
    real_concatenate = np.concatenate
    real_pad = M.pad_and_concatenate

    def counting_concatenate(*a, **k):
        calls["concatenate"] += 1
        return real_concatenate(*a, **k)

    def counting_pad(*a, **k):
        calls["pad"] += 1
        return real_pad(*a, **k)

    monkeypatch.setattr(M.np, "concatenate", counting_concatenate)
    monkeypatch.setattr(M, "pad_and_concatenate", counting_pad)

    acc = EvalAccumulator()
    for _ in range(20):
        acc.add(torch.ones(4, 3))
    assert calls == {"concatenate": 0, "pad": 0}  # add() only moves and stores
    out = acc.get_arrays()
    assert out.shape == (80, 3)
    assert calls == {"concatenate": 1, "pad": 1}
    acc.get_arrays()
    assert calls == {"concatenate": 1, "pad": 1}  # cached, not redone

    var = EvalAccumulator()
    for n in range(1, 11):
        var.add(torch.ones(2, n))
    assert var.get_arrays().shape == (20, 10)
    assert calls == {"concatenate": 1, "pad": 2}  # one padded pass, no concatenate at all

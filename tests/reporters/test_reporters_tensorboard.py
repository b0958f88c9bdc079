"""TensorBoard reporter, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time

import pytest
from kit.reporters import TinyModel, drive, logged, make_args, make_state

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

from trainwright.reporters.tensorboard import TensorBoardCallback  # noqa: E402


def load(log_dir) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    return [(e.step, pytest.approx(e.value)) for e in acc.Scalars(tag)]


def text(acc, tag) -> str:
    return acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()


LOGS = [
    (2, {"loss": 1.5, "learning_rate": 0.1, "epoch": 0.2}),
    (4, {"loss": 1.0, "learning_rate": 0.05, "throughput/samples_per_sec": 128.0}),
    (
        4,
        {
            "eval_loss": 1.25,
            "eval_runtime": 0.5,
            "eval_note": "looks fine",
            "eval_confusion": [[1, 0], [0, 1]],
        },
    ),
]


def test_scalars_text_args_and_config_are_written(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    caplog.set_level(logging.WARNING)
    args = make_args(tmp_path / "out", learning_rate=3e-4)
    reporter = TensorBoardCallback()
    drive(reporter, args, LOGS + [(6, {"eval_confusion": [[2, 0], [0, 2]]})], model=TinyModel())
    assert reporter.tb_writer is None  # closed at train end

    acc = load(tmp_path / "tb")
    assert scalars(acc, "train/loss") == [(2, 1.5), (4, 1.0)]
    assert scalars(acc, "train/learning_rate") == [(2, 0.1), (4, 0.05)]
    assert scalars(acc, "throughput/samples_per_sec") == [(4, 128.0)]
    assert scalars(acc, "eval/loss") == [(4, 1.25)]
    assert "eval/confusion" not in acc.Tags()["scalars"]
    assert text(acc, "eval/note/text_summary") == "looks fine"
    assert json.loads(text(acc, "args/text_summary"))["learning_rate"] == 3e-4
    assert json.loads(text(acc, "model_config/text_summary")) == {"hidden_size": 4, "model_type": "tiny"}
    # hparams are in the run's own event file (no extra subfolder)
    meta = acc.SummaryMetadata("_hparams_/session_start_info")
    assert meta.plugin_data.plugin_name == "hparams"
    hparams = plugin_data_pb2.HParamsPluginData.FromString(
        meta.plugin_data.content
    ).session_start_info.hparams
    assert hparams["learning_rate"].number_value == pytest.approx(3e-4)
    assert hparams["run_name"].string_value == "run-1"
    assert [p.name for p in (tmp_path / "tb").iterdir() if p.is_dir()] == []
    dropped = logged(caplog, "eval/confusion")
    assert len(dropped) == 1  # warned once although logged twice


def test_default_folder_is_output_dir_runs_date_host(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    args = make_args(tmp_path)
    drive(TensorBoardCallback(), args, LOGS[:1])
    (run,) = os.listdir(tmp_path / "runs")
    assert re.fullmatch(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_" + re.escape(socket.gethostname()), run)
    assert scalars(load(tmp_path / "runs" / run), "train/loss") == [(2, 1.5)]


def test_logging_dir_argument_and_trial_subfolders(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    args = make_args(tmp_path, logging_dir=str(tmp_path / "logs"))
    reporter = TensorBoardCallback()
    for trial in ("trial-a", "trial-b"):
        state = make_state(is_hyper_param_search=True, trial_name=trial)
        drive(reporter, args, [(1, {"loss": 1.0 if trial == "trial-a" else 2.0})], state=state)
    assert scalars(load(tmp_path / "logs" / "trial-a"), "train/loss") == [(1, 1.0)]
    assert scalars(load(tmp_path / "logs" / "trial-b"), "train/loss") == [(1, 2.0)]


def test_given_writer_is_used_and_left_open(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path / "mine"))
    reporter = TensorBoardCallback(tb_writer=writer)
    drive(reporter, make_args(tmp_path), LOGS[:1])
    writer.add_scalar("after", 1.0, 9)  # still open
    writer.close()
    acc = load(tmp_path / "mine")
    assert scalars(acc, "train/loss") == [(2, 1.5)] and scalars(acc, "after") == [(9, 1.0)]


def test_evaluate_without_training_opens_the_writer(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    reporter = TensorBoardCallback()
    reporter.on_log(make_args(tmp_path), make_state(global_step=7), None, logs={"eval_loss": 0.5})
    reporter.tb_writer.close()
    assert scalars(load(tmp_path / "tb"), "eval/loss") == [(7, 0.5)]


def test_writer_failure_disables_the_reporter(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    caplog.set_level(logging.WARNING)
    reporter = TensorBoardCallback()
    args = make_args(tmp_path)
    drive(reporter, args, LOGS[:1], train_end=False)

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(reporter.tb_writer, "add_scalar", broken)
    drive(reporter, args, LOGS[1:2])
    assert reporter.disabled
    assert len(logged(caplog, "tensorboard reporter is disabled")) == 1


def test_an_evaluate_after_train_writes_into_the_same_run_folder(tmp_path, monkeypatch):
    """A real Trainer, `report_to="tensorboard"`: train() then evaluate() leave one run folder under
    output_dir/runs, holding the training and the final evaluation's scalars (transformers writes one)."""
    from conftest import RegressionDataset
    from kit.runs import regression_trainer

    from trainwright import TrainingArguments

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        logging_steps=2,
        report_to="tensorboard",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = regression_trainer(args, RegressionDataset(16))
    trainer.train()
    time.sleep(1.1)  # a run folder's name has the time to the second: a new folder would be another name
    trainer.evaluate()
    (run,) = os.listdir(tmp_path / "runs")
    acc = load(tmp_path / "runs" / run)
    assert [step for step, _ in scalars(acc, "train/loss")] == [2, 4]
    assert [step for step, _ in scalars(acc, "eval/loss")] == [4]

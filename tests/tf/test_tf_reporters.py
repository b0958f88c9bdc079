"""TFTrainer's W&B and Comet reporting, offline (the shared reporters, read back from their files)."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("tensorflow")

from kit.reporters import (  # noqa: E402
    by_kind,
    comet_offline,
    end_and_read,
    finish_and_flush,
    items,
    merged,
    offline_run_files,
    read_records,
    wandb_offline,
)
from tfkit import make_data, make_model  # noqa: E402

from trainwright import TFTrainer, TFTrainingArguments  # noqa: E402


def _args(tmp_path, **kw):
    return TFTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        max_steps=4,
        logging_steps=2,
        disable_tqdm=True,
        run_name="tf-run",
        **kw,
    )


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_offline_run_gets_config_and_history(monkeypatch, tmp_path):
    wandb_offline(monkeypatch, tmp_path)
    try:
        trainer = TFTrainer(make_model(), _args(tmp_path, report_to="wandb"), make_data(32))
        trainer.setup_wandb()  # v4's public set-up: the run exists before training
        import wandb

        assert wandb.run is not None and wandb.run.name == "tf-run"
        trainer.train()
    finally:
        finish_and_flush()
    records = read_records(offline_run_files(tmp_path)[0])
    config = merged(records, "config")
    assert config["per_device_train_batch_size"] == 8 and config["poly_power"] == 1.0
    steps = [
        h["train/global_step"]
        for h in (items(r.item) for r in by_kind(records, "history"))
        if "train/loss" in h
    ]
    assert steps == [2, 4]

    monkeypatch.setenv("WANDB_LOG_MODEL", "end")  # needs a PyTorch module: refused, not ignored
    with pytest.raises(ValueError, match="WANDB_LOG_MODEL"):
        TFTrainer(make_model(), _args(tmp_path, report_to="wandb"), make_data(32))


@pytest.mark.skipif(importlib.util.find_spec("comet_ml") is None, reason="comet_ml is not installed")
def test_comet_offline_experiment_gets_parameters_and_metrics(monkeypatch, tmp_path):
    comet_offline(monkeypatch, tmp_path)
    monkeypatch.setenv("COMET_LOG_ASSETS", "false")
    trainer = TFTrainer(make_model(), _args(tmp_path), make_data(32))
    trainer.setup_comet()  # v4's public set-up, without report_to
    trainer.train()
    messages = end_and_read(tmp_path)
    params = {}
    for m in messages:
        if m["type"] == "parameter_msg":
            p = m["payload"].get("param") or m["payload"]["params"]
            params[p["paramName"]] = p["paramValue"]
    assert params["args_per_device_train_batch_size"] == 8
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    assert sorted(m["step"] for m in metrics if m["metricName"] == "train/loss") == [2, 4]


def test_jsonl_rows_and_unsupported_reporters_refused(tmp_path):
    trainer = TFTrainer(make_model(), _args(tmp_path, report_to=["jsonl"]), make_data(32))
    trainer.train()
    rows = [json.loads(line) for line in open(tmp_path / "out" / "logs.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [2, 4]
    with pytest.raises(ValueError, match="mlflow"):  # reads PyTorch modules: refused, not half-working
        TFTrainer(make_model(), _args(tmp_path, report_to=["mlflow"]), make_data(32))

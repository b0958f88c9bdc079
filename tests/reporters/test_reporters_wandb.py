"""W&B reporter in offline mode; the run's .wandb transaction log is read back record by record."""

from __future__ import annotations

import logging

import pytest
from kit.reporters import (
    TinyModel,
    by_kind,
    drive,
    finish_and_flush,
    items,
    logged,
    make_args,
    make_state,
    merged,
    offline_run_files,
    read_records,
    wandb_offline,
)

wandb = pytest.importorskip("wandb")

from trainwright.reporters.wandb import WandbCallback  # noqa: E402


@pytest.fixture
def offline(monkeypatch, tmp_path):
    wandb_offline(monkeypatch, tmp_path)
    yield monkeypatch
    finish_and_flush()  # also resets wandb's process-wide settings (WANDB_DIR...)


LOGS = [
    (2, {"loss": 1.5, "learning_rate": 0.1, "epoch": 0.2}),
    (4, {"eval_loss": 1.25, "eval_accuracy": 0.5}),
    (4, {"train_runtime": 3.5, "train_loss": 1.2, "total_flos": 10.0, "epoch": 0.4}),
]


def test_offline_run_config_history_and_summary(offline, tmp_path):
    offline.setenv("WANDB_PROJECT", "tiny-project")
    reporter = WandbCallback()
    drive(
        reporter, make_args(tmp_path / "out", run_name="wb-run", learning_rate=3e-4), LOGS, model=TinyModel()
    )
    assert wandb.run is not None  # left open after training, as transformers does
    finish_and_flush()

    (path,) = offline_run_files(tmp_path)
    records = read_records(path)
    (run,) = by_kind(records, "run")
    assert run.display_name == "wb-run" and run.project == "tiny-project"
    config = merged(records, "config")
    assert config["learning_rate"] == 3e-4 and config["hidden_size"] == 4
    assert config["model/num_parameters"] == 10
    history = [items(h.item) for h in by_kind(records, "history")]
    rows = [{k: v for k, v in h.items() if not k.startswith("_")} for h in history]
    assert rows == [
        {"train/loss": 1.5, "train/learning_rate": 0.1, "train/epoch": 0.2, "train/global_step": 2},
        {"eval/loss": 1.25, "eval/accuracy": 0.5, "train/global_step": 4},
        {"train/epoch": 0.4, "train/global_step": 4},
    ]
    summary = merged(records, "summary")
    assert summary["train_runtime"] == 3.5 and summary["train_loss"] == 1.2 and summary["total_flos"] == 10.0
    metrics = {m.glob_name or m.name: m for m in by_kind(records, "metric")}
    assert metrics["*"].step_metric == "train/global_step"


def test_default_project_is_huggingface(offline, tmp_path):
    drive(WandbCallback(), make_args(tmp_path), LOGS[:1])
    finish_and_flush()
    (run,) = by_kind(read_records(offline_run_files(tmp_path)[0]), "run")
    assert run.project == "huggingface"


def test_checkpoint_and_final_model_artifacts(offline, tmp_path):
    offline.setenv("WANDB_LOG_MODEL", "checkpoint")
    drive(WandbCallback(), make_args(tmp_path / "out"), LOGS[:2], model=TinyModel(), save_steps=[2, 4])
    run_id = wandb.run.id
    finish_and_flush()
    artifacts = by_kind(read_records(offline_run_files(tmp_path)[0]), "artifact")
    assert [a.name for a in artifacts] == [f"model-{run_id}"] * 3
    aliases = [set(a.aliases) - {"latest"} for a in artifacts]  # wandb adds "latest" itself
    assert aliases == [{"checkpoint-2"}, {"checkpoint-4"}, {"final"}]
    files = [sorted(e.path for e in a.manifest.contents) for a in artifacts]
    assert files[0] == ["model.safetensors", "trainer_state.json"]
    assert files[2] == ["model.safetensors"]


def test_watch_hooks_the_model(offline, tmp_path):
    offline.setenv("WANDB_WATCH", "all")
    model = TinyModel()
    drive(WandbCallback(), make_args(tmp_path), LOGS[:1], model=model)
    assert any(p._backward_hooks for p in model.parameters()) or model._forward_hooks
    finish_and_flush()


def test_trials_are_separate_runs_grouped_by_run_name(offline, tmp_path):
    reporter = WandbCallback()
    for trial in ("t0", "t1"):
        state = make_state(is_hyper_param_search=True, trial_name=trial)
        drive(reporter, make_args(tmp_path, run_name="search"), LOGS[:1], state=state)
    assert wandb.run is None  # finished at the end of each trial
    finish_and_flush()
    runs = [by_kind(read_records(p), "run")[0] for p in offline_run_files(tmp_path)]
    assert sorted(r.display_name for r in runs) == ["t0", "t1"] and {r.run_group for r in runs} == {"search"}


def test_disabled_and_bad_settings(offline, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainwright")
    offline.setenv("WANDB_DISABLED", "true")
    reporter = WandbCallback()
    drive(reporter, make_args(tmp_path), LOGS[:1])
    assert reporter.disabled and offline_run_files(tmp_path) == [] and wandb.run is None
    assert len(logged(caplog, "WANDB_DISABLED")) == 1
    offline.setenv("WANDB_DISABLED", "false")
    offline.setenv("WANDB_LOG_MODEL", "sometimes")
    with pytest.raises(ValueError, match="WANDB_LOG_MODEL='sometimes'"):
        WandbCallback()

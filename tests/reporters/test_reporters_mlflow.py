"""MLflow reporter against a real local tracking store, read back with MlflowClient."""

from __future__ import annotations

import logging
import os

import pytest
from kit.reporters import TinyModel, drive, logged, make_args, make_state

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from mlflow_kit import client_for, history, isolated_mlflow, local_store, only_run  # noqa: E402, F401

from trainwright.reporters.mlflow import MLflowCallback  # noqa: E402

LOGS = [
    (2, {"loss": 1.5, "learning_rate": 0.1, "epoch": 0.2}),
    (4, {"loss": 1.0, "learning_rate": 0.05, "epoch": 0.4}),
    (4, {"eval_loss": 1.25, "eval_note": "text is not a metric"}),
]


def test_params_metrics_tags_and_run_lifecycle(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TAGS", '{"team": "nlp", "ticket": 42}')
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tiny-exp")
    caplog.set_level(logging.WARNING)
    out = tmp_path / "out"
    args = make_args(out, learning_rate=3e-4, run_name="my-run")
    drive(MLflowCallback(), args, LOGS, model=TinyModel())
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"  # our default local store needs it

    client = client_for(out)
    run = only_run(client)
    assert client.get_experiment(run.info.experiment_id).name == "tiny-exp"
    assert run.info.run_name == "my-run" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["learning_rate"] == "0.0003" and params["output_dir"] == str(out)
    assert params["hidden_size"] == "4"  # model config
    assert run.data.tags["team"] == "nlp" and run.data.tags["ticket"] == "42"
    assert history(client, run.info.run_id, "loss") == [(2, 1.5), (4, 1.0)]
    assert history(client, run.info.run_id, "eval_loss") == [(4, 1.25)]
    assert "eval_note" not in run.data.metrics
    assert len(logged(caplog, "eval_note")) == 1
    assert mlflow.active_run() is None


def test_run_name_from_env_flattened_truncated_and_capped_params(tmp_path, monkeypatch):
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    monkeypatch.setenv("MLFLOW_RUN_NAME", "env-name")
    monkeypatch.setenv("MLFLOW_FLATTEN_PARAMS", "1")
    args = make_args(tmp_path, run_name="ignored", lr_scheduler_kwargs={"power": 2.0, "inner": {"x": 1}})
    long_value = "y" * (MAX_PARAM_VAL_LENGTH + 50)
    model = TinyModel()
    model.config.model_type = long_value
    drive(MLflowCallback(), args, LOGS[:1], model=model)
    run = only_run(client_for(tmp_path))
    assert run.info.run_name == "env-name"
    assert run.data.params["lr_scheduler_kwargs.power"] == "2.0"
    assert run.data.params["lr_scheduler_kwargs.inner.x"] == "1"
    assert run.data.params["model_type"] == long_value[:MAX_PARAM_VAL_LENGTH]

    monkeypatch.setenv("MLFLOW_MAX_LOG_PARAMS", "5")
    # a second run in this process with another output_dir gets its own default store
    drive(MLflowCallback(), make_args(tmp_path / "capped"), LOGS[:1])
    assert len(only_run(client_for(tmp_path / "capped")).data.params) == 5


def test_nested_run_under_the_active_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "true")
    uri = local_store(monkeypatch, tmp_path)
    with mlflow.start_run(run_name="parent") as parent:
        drive(MLflowCallback(), make_args(tmp_path, run_name="child"), LOGS[:1])
        assert mlflow.active_run().info.run_id == parent.info.run_id  # parent untouched
    client = MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs(["0"])}
    assert runs["child"].data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert runs["child"].info.status == "FINISHED"


def test_active_run_is_used_and_left_running(tmp_path, monkeypatch):
    uri = local_store(monkeypatch, tmp_path)
    with mlflow.start_run() as outer:
        drive(MLflowCallback(), make_args(tmp_path), LOGS[:1])
        assert mlflow.active_run().info.run_id == outer.info.run_id
        assert MlflowClient(uri).get_run(outer.info.run_id).info.status == "RUNNING"
    assert history(MlflowClient(uri), outer.info.run_id, "loss") == [(2, 1.5)]


def test_resume_run_by_id_appends_without_relogging_params(tmp_path, monkeypatch):
    args = make_args(tmp_path)
    drive(MLflowCallback(), args, LOGS[:2])
    client = client_for(tmp_path)
    run_id = only_run(client).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    args.learning_rate = 1.0  # a changed value would make MLflow refuse to log the param again
    drive(MLflowCallback(), args, [(6, {"loss": 0.5})], state=make_state(global_step=4))
    run = client.get_run(run_id)
    assert history(client, run_id, "loss") == [(2, 1.5), (4, 1.0), (6, 0.5)]
    assert run.data.params["learning_rate"] == "5e-05" and run.info.status == "FINISHED"


def test_checkpoints_and_final_model_as_artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "true")
    drive(MLflowCallback(), make_args(tmp_path), LOGS[:2], model=TinyModel(), save_steps=[2, 4])
    client = client_for(tmp_path)
    run_id = only_run(client).info.run_id
    assert {a.path for a in client.list_artifacts(run_id)} == {"checkpoint-2", "checkpoint-4", "model"}
    assert {a.path for a in client.list_artifacts(run_id, "checkpoint-4")} == {
        "checkpoint-4/model.safetensors",
        "checkpoint-4/trainer_state.json",
    }
    assert [a.path for a in client.list_artifacts(run_id, "model")] == ["model/model.safetensors"]


def test_unreachable_server_disables_reporter_and_training_continues(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    caplog.set_level(logging.WARNING)
    reporter = MLflowCallback()
    state = drive(reporter, make_args(tmp_path), LOGS)
    assert reporter.disabled and state.global_step == 4
    messages = logged(caplog, "mlflow reporter is disabled")
    assert len(messages) == 1 and "on_train_begin" in messages[0]

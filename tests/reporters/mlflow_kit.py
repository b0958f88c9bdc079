"""MLflow for the MLflow reporter tests: each test isolated from the environment and from the
process-wide state of earlier tests, and local file stores read back with MlflowClient."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from mlflow.tracking._tracking_service import utils as tracking_utils

from trainwright.reporters.base import TIMEOUT_ENV

MLFLOW_VARS = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "MLFLOW_EXPERIMENT_ID",  # mlflow.set_experiment sets it in os.environ
    "MLFLOW_RUN_ID",
    "MLFLOW_RUN_NAME",
    "MLFLOW_NESTED_RUN",
    "MLFLOW_TAGS",
    "MLFLOW_FLATTEN_PARAMS",
    "MLFLOW_MAX_LOG_PARAMS",
    "HF_MLFLOW_LOG_ARTIFACTS",
    "MLFLOW_ALLOW_FILE_STORE",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    TIMEOUT_ENV,
)


@pytest.fixture(autouse=True)
def isolated_mlflow(monkeypatch):
    """Autouse in every module that imports it."""
    for name in MLFLOW_VARS:
        monkeypatch.delenv(name, raising=False)
    # set_tracking_uri is process-global: undo it after each test
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()


def local_store(monkeypatch, folder) -> str:
    """Point MLflow at a file store in `folder`/mlruns; its URI."""
    uri = (folder / "mlruns").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


def client_for(output_dir) -> MlflowClient:
    """A client of the default store of a run into `output_dir`."""
    return MlflowClient((output_dir / "mlruns").resolve().as_uri())


def only_run(client):
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


def history(client, run_id, key, arrival_order: bool = False) -> list[tuple[int, float]]:
    """(step, value) of each `key` metric, by step; `arrival_order`: in the order the store returns
    them (arrival order for a file store), not re-sorted."""
    metrics = client.get_metric_history(run_id, key)
    if not arrival_order:
        metrics = sorted(metrics, key=lambda m: m.step)
    return [(m.step, m.value) for m in metrics]

"""MLflow: parameters, metrics with steps, tags, nested/resumed runs, checkpoints as artifacts."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from trainwright.reporters.base import (
    Reporter,
    env_flag,
    env_int,
    env_json_dict,
    export_model,
    flatten_dict,
    model_config_dict,
    saved_checkpoint_dir,
)

logger = logging.getLogger(__name__)

_default_store_uri: str | None = None  # the local store URI this module last chose


def _without_credentials(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit(parts._replace(netloc=netloc))
    return uri


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class MLflowCallback(Reporter):
    """Logs to MLflow.

    Tracking store: `MLFLOW_TRACKING_URI` (or a URI set with `mlflow.set_tracking_uri`); when neither
    is set, a local store in `output_dir/mlruns` (mlflow 3 keeps its plain-folder store behind
    `MLFLOW_ALLOW_FILE_STORE`, which is then turned on for this process). Run: the one named by
    `MLFLOW_RUN_ID` (resumed), else the active run, else a new one (`MLFLOW_NESTED_RUN`: a child
    of the active run) named `MLFLOW_RUN_NAME` or `args.run_name`, in experiment
    `MLFLOW_EXPERIMENT_NAME`. Parameters: the model config and `args.to_dict()` (flattened with
    `MLFLOW_FLATTEN_PARAMS`, at most `MLFLOW_MAX_LOG_PARAMS` of them, values cut to MLflow's length
    limit); on a resumed run, parameters it already has are not logged again. Tags: `MLFLOW_TAGS`
    (a JSON object). Metrics: numbers at `state.global_step`, keys as logged. Artifacts
    (`HF_MLFLOW_LOG_ARTIFACTS`): each checkpoint folder when saved, and the final model under
    `model/` at the end of training. The run is ended at the end of training only if this
    reporter started it.

    With a tracking server (any URI but a local folder or SQLite file) the events run on the
    reporter's worker thread (see `Reporter`): the run is started there, so `mlflow.active_run()`
    on the training thread does not return it (`run_id` names it); an active run of the training
    thread is still joined (or nested under, with `MLFLOW_NESTED_RUN`).
    """

    name = "mlflow"
    requires: ClassVar[tuple[str, ...]] = ("mlflow",)
    pip_name = "mlflow-skinny"
    extra = "mlflow"

    def __init__(self) -> None:
        super().__init__()
        self.log_artifacts = env_flag("HF_MLFLOW_LOG_ARTIFACTS")
        self.nested = env_flag("MLFLOW_NESTED_RUN")
        self.flatten_params = env_flag("MLFLOW_FLATTEN_PARAMS")
        self.max_params = env_int("MLFLOW_MAX_LOG_PARAMS")
        self.tags = env_json_dict("MLFLOW_TAGS")
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or None
        self.resume_run_id = os.environ.get("MLFLOW_RUN_ID") or None
        self.run_name_env = os.environ.get("MLFLOW_RUN_NAME") or None
        self.run_id: str | None = None
        self._client: Any = None
        self._started_run = False
        self._caller_active_run: Any = None  # the training thread's active run, read before queuing

    def _user_tracking_uri(self) -> str | None:
        """The tracking URI the user chose (variable or `mlflow.set_tracking_uri`), else None."""
        if "mlflow" not in sys.modules:
            return os.environ.get("MLFLOW_TRACKING_URI") or None
        import mlflow
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

        if is_tracking_uri_set() and mlflow.get_tracking_uri() != _default_store_uri:
            return mlflow.get_tracking_uri()
        return None

    def service_address(self) -> str | None:
        uri = self._user_tracking_uri()
        if uri is None:
            return None  # the local store in output_dir/mlruns
        scheme = urlsplit(uri).scheme.lower()
        if scheme in ("", "file", "sqlite") or len(scheme) == 1:  # a folder, a database file, C:\...
            return None
        return _without_credentials(uri) + " (MLFLOW_TRACKING_URI)"

    def _on_training_thread(self, event: str) -> None:
        # mlflow keeps the active run per thread: the worker cannot see the caller's.
        if self.run_id is None and "mlflow" in sys.modules:
            import mlflow

            self._caller_active_run = mlflow.active_run()

    # -- set-up -------------------------------------------------------------------------------
    def _set_tracking_uri(self, args: Any) -> None:
        import mlflow
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

        global _default_store_uri
        # mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI, so a URI we chose earlier (for
        # another output_dir) looks user-set; only a URI we did not choose is the user's.
        if is_tracking_uri_set() and mlflow.get_tracking_uri() != _default_store_uri:
            return
        store = Path(args.output_dir, "mlruns").resolve()
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        _default_store_uri = store.as_uri()
        mlflow.set_tracking_uri(_default_store_uri)
        logger.info("MLflow: no MLFLOW_TRACKING_URI set, logging to the local store %s", store)

    def setup(self, args: Any, state: Any, model: Any) -> None:
        """Start (or resume/join) the MLflow run and log parameters, as `on_train_begin` does."""
        self._start(args, state, model)

    def _start(self, args: Any, state: Any, model: Any) -> None:
        import mlflow

        self._set_tracking_uri(args)
        if self.experiment_name:
            mlflow.set_experiment(self.experiment_name)
        active = mlflow.active_run()
        parent_tags = None
        if active is None and self._caller_active_run is not None:  # on the worker thread
            active = self._caller_active_run
            from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

            parent_tags = {MLFLOW_PARENT_RUN_ID: active.info.run_id}
        if self.resume_run_id:
            if active is not None and active.info.run_id == self.resume_run_id:
                run = active
            else:
                run = mlflow.start_run(run_id=self.resume_run_id, nested=active is not None)
                self._started_run = True
        elif active is None or self.nested:
            run_name = self.run_name_env or getattr(args, "run_name", None)
            if state.is_hyper_param_search and state.trial_name:
                run_name = f"{run_name}-{state.trial_name}" if run_name else str(state.trial_name)
            if parent_tags is not None and self.nested:  # the parent is active on another thread
                run = mlflow.start_run(run_name=run_name, tags=parent_tags)
            else:
                run = mlflow.start_run(run_name=run_name, nested=self.nested and active is not None)
            self._started_run = True
        else:
            run = active
        self.run_id = run.info.run_id
        self._client = mlflow.tracking.MlflowClient(mlflow.get_tracking_uri())
        if self.tags:
            from mlflow.entities import RunTag

            tags = [RunTag(str(k), str(v)) for k, v in self.tags.items()]
            self._client.log_batch(self.run_id, tags=tags, synchronous=True)
        self._log_params(args, model)

    def _log_params(self, args: Any, model: Any) -> None:
        from mlflow.entities import Param
        from mlflow.utils import validation

        combined = {**(model_config_dict(model) or {}), **args.to_dict()}
        if self.flatten_params:
            combined = flatten_dict(combined)
        if self.resume_run_id:
            already = self._client.get_run(self.run_id).data.params
            combined = {k: v for k, v in combined.items() if k not in already}
        limit = getattr(validation, "MAX_PARAM_VAL_LENGTH", 500)
        params, cut = [], []
        for key, value in combined.items():
            text = str(value)
            if len(text) > limit:
                text = text[:limit]
                cut.append(key)
            params.append(Param(key, text))
        if cut:
            logger.warning("MLflow: values of %s were cut to %d characters (MLflow's limit)", cut, limit)
        if self.max_params is not None and len(params) > self.max_params:
            logger.info(
                "MLflow: logging %d of %d parameters (MLFLOW_MAX_LOG_PARAMS)", self.max_params, len(params)
            )
            params = params[: self.max_params]
        batch = getattr(validation, "MAX_PARAMS_TAGS_PER_BATCH", 100)
        for chunk in _chunks(params, batch):
            self._client.log_batch(self.run_id, params=chunk, synchronous=True)

    # -- events -------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.run_id is None:
            self._start(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs:
            return
        if self.run_id is None:
            self._start(args, state, model)
        from mlflow.entities import Metric
        from mlflow.utils import validation

        scalars, texts = self.split_logs(logs)
        for key, value in texts.items():
            self.drop_once(key, value)
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, state.global_step) for k, v in scalars.items()]
        for chunk in _chunks(metrics, getattr(validation, "MAX_METRICS_PER_BATCH", 1000)):
            self._client.log_batch(self.run_id, metrics=chunk)

    def on_save(self, args, state, control, **kwargs):
        if not self.log_artifacts or self.run_id is None:
            return
        checkpoint = saved_checkpoint_dir(args, state)
        if checkpoint is None:
            logger.warning("MLflow: no checkpoint folder for step %d to log as artifact", state.global_step)
            return
        self._client.log_artifacts(self.run_id, checkpoint, artifact_path=os.path.basename(checkpoint))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.run_id is None:
            return
        if self.log_artifacts and model is not None:
            with tempfile.TemporaryDirectory() as tmp:
                self._client.log_artifacts(self.run_id, export_model(model, tmp), artifact_path="model")
        self._end_run("FINISHED")

    def _end_run(self, status: str) -> None:
        import mlflow

        if self._started_run:
            active = mlflow.active_run()
            if active is not None and active.info.run_id == self.run_id:
                mlflow.end_run(status)
            else:
                self._client.set_terminated(self.run_id, status)
        self.run_id = None
        self._started_run = False

    def close_after_failure(self) -> None:
        if self.run_id is not None:
            self._end_run("FAILED")

"""Reporting integrations and the `report_to` registry.

`report_to` takes a name, a list of names, "all" (every installed reporter that can run unattended)
or "none". A reporter's package is imported only when the reporter is used; asking for one whose
package is missing raises `MissingReporterPackageError` saying what to pip install. Every reporter
logs from the main process only, starts lazily, and if it fails mid-run it warns once and turns
itself off: training never stops because a tracking service did.

Environment variables, per reporter (read when the reporter is created; bad values are errors):

- tensorboard: TENSORBOARD_LOGGING_DIR (else args.logging_dir, else output_dir/runs/<date>_<host>).
- mlflow: MLFLOW_TRACKING_URI (default: a local store in output_dir/mlruns, see MLflowCallback),
  MLFLOW_EXPERIMENT_NAME, MLFLOW_RUN_NAME (else args.run_name), MLFLOW_RUN_ID (resume that run),
  MLFLOW_NESTED_RUN, MLFLOW_TAGS (JSON object), MLFLOW_FLATTEN_PARAMS, MLFLOW_MAX_LOG_PARAMS,
  HF_MLFLOW_LOG_ARTIFACTS (checkpoints and the final model as artifacts).
- wandb: WANDB_PROJECT (default "huggingface", as transformers), WANDB_LOG_MODEL
  (false/end/checkpoint), WANDB_WATCH (false/gradients/parameters/all), WANDB_DISABLED; wandb itself
  reads WANDB_MODE (offline), WANDB_DIR, WANDB_API_KEY, WANDB_ENTITY, WANDB_RUN_ID, WANDB_RESUME.
- comet_ml: COMET_MODE (offline/online/disabled/get/create/get_or_create), COMET_START_ONLINE,
  COMET_PROJECT_NAME, COMET_LOG_ASSETS (default true); comet reads COMET_API_KEY,
  COMET_OFFLINE_DIRECTORY and its other COMET_* settings.
- neptune: NEPTUNE_PROJECT, NEPTUNE_API_TOKEN; neptune reads NEPTUNE_MODE (offline: ./.neptune).
- clearml: CLEARML_PROJECT, CLEARML_TASK, CLEARML_LOG_MODEL; clearml reads CLEARML_OFFLINE_MODE,
  CLEARML_CONFIG_FILE, CLEARML_API_ACCESS_KEY / CLEARML_API_SECRET_KEY.
- dvclive: HF_DVCLIVE_LOG_MODEL (false/true/all).
- codecarbon: CODECARBON_COUNTRY_ISO_CODE (default USA); codecarbon reads CODECARBON_OUTPUT_DIR,
  CODECARBON_LOG_LEVEL and its other settings.
- azure_ml: none ("all" includes it only when AZUREML_RUN_ID is set).
- dagshub: MLFLOW_TRACKING_URI (required, https://dagshub.com/<owner>/<repo>.mlflow),
  HF_DAGSHUB_LOG_ARTIFACTS, HF_DAGSHUB_MODEL_NAME (default "main"), BRANCH (default "main"), and
  every mlflow variable above.
- flyte: none ("all" includes it only when FLYTE_INTERNAL_EXECUTION_ID is set).
- swanlab: SWANLAB_PROJECT, SWANLAB_LOG_MODEL (accepted, warned: SwanLab stores no models),
  SWANLAB_RUN_ID / SWANLAB_RESUME; swanlab reads SWANLAB_MODE (local/offline/cloud/disabled),
  SWANLAB_LOG_DIR, SWANLAB_API_KEY, SWANLAB_WORKSPACE.
- kubeflow (no package): KUBEFLOW_TRAINER_SERVER_URL (required; "all" includes it only when set),
  KUBEFLOW_TRAINER_SERVER_CA_CERT, KUBEFLOW_TRAINER_SERVER_TOKEN, DISABLE_KUBEFLOW_INTEGRATION.
- jsonl / csv (trainwright's own, no package): none; they write output_dir/logs.jsonl or logs.csv.

A slow or dead server never stalls training: a reporter that talks to a server (MLflow with a
tracking server, DagsHub, W&B, Comet, Neptune, ClearML online, SwanLab, Kubeflow) runs its events on
its own worker thread, in order, and the training thread only queues them (microseconds).
TRAINWRIGHT_REPORTER_TIMEOUT (seconds, default 30) bounds each event, starting the run included,
and the wait for queued events at the end of training (once); past it the reporter is switched off
with one warning naming it, its server and this variable. 0 runs every reporter on the training
thread without a deadline (as upstream). File reporters (tensorboard, jsonl, csv, dvclive,
codecarbon, MLflow's local store) and azure_ml / flyte always run on the training thread.

"all" leaves out, with one info line each saying why: reporters whose package is not installed
(silently), reporters that would need credentials they do not have (W&B, Comet, Neptune, ClearML
online without keys, SwanLab in cloud mode without a key), those tied to a platform they are not
running on (Azure ML, Flyte, DagsHub, Kubeflow),
those turned off by their own variable (WANDB_DISABLED, COMET_MODE=disabled), and "csv" (the same
rows as "jsonl", which it does include).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable

from trainwright.reporters.base import MissingReporterPackageError, Reporter, rewrite_logs

logger = logging.getLogger(__name__)

__all__ = [
    "INTEGRATION_TO_CALLBACK",
    "MissingReporterPackageError",
    "Reporter",
    "get_available_reporting_integrations",
    "get_reporter_class",
    "get_reporting_integration_callbacks",
    "normalize_report_to",
    "rewrite_logs",
]

INTEGRATION_TO_CALLBACK: dict[str, str] = {
    "azure_ml": "trainwright.reporters.azureml:AzureMLCallback",
    "comet_ml": "trainwright.reporters.comet:CometCallback",
    "mlflow": "trainwright.reporters.mlflow:MLflowCallback",
    "neptune": "trainwright.reporters.neptune:NeptuneCallback",
    "tensorboard": "trainwright.reporters.tensorboard:TensorBoardCallback",
    "wandb": "trainwright.reporters.wandb:WandbCallback",
    "codecarbon": "trainwright.reporters.codecarbon:CodeCarbonCallback",
    "clearml": "trainwright.reporters.clearml:ClearMLCallback",
    "dagshub": "trainwright.reporters.dagshub:DagsHubCallback",
    "flyte": "trainwright.reporters.flyte:FlyteCallback",
    "dvclive": "trainwright.reporters.dvclive:DVCLiveCallback",
    "swanlab": "trainwright.reporters.swanlab:SwanLabCallback",
    "kubeflow": "trainwright.reporters.kubeflow:KubeflowCallback",
    "jsonl": "trainwright.reporters.files:JsonlCallback",
    "csv": "trainwright.reporters.files:CsvCallback",
}

# Names "all" never picks by itself (see the module docstring).
_NOT_IN_ALL = frozenset({"csv"})


def get_reporter_class(name: str) -> type[Reporter]:
    """The reporter class registered under `name` (its service package is not imported)."""
    if name not in INTEGRATION_TO_CALLBACK:
        raise ValueError(
            f"report_to: unknown integration {name!r}; valid names are "
            + ", ".join(sorted(INTEGRATION_TO_CALLBACK) + ["all", "none"])
        )
    module_name, _, class_name = INTEGRATION_TO_CALLBACK[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def get_available_reporting_integrations() -> list[str]:
    """Names of the reporters whose packages are installed, in registry order."""
    return [name for name in INTEGRATION_TO_CALLBACK if not get_reporter_class(name).missing_packages()]


def normalize_report_to(report_to: str | Iterable[str] | None) -> list[str]:
    """`report_to` as a list of registered names: None/"none"/[] -> [], "all" -> every installed
    reporter that can run unattended; unknown names raise ValueError (before anything is imported)."""
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"report_to: expected integration names (strings), got {name!r}")
    names = [n.strip() for n in names]
    for name in names:
        if name not in INTEGRATION_TO_CALLBACK and name not in ("all", "none"):
            get_reporter_class(name)  # raises the ValueError listing the valid names
    if "none" in names:
        if len(names) > 1:
            raise ValueError(f"report_to: 'none' cannot be combined with other names, got {names}")
        return []
    out: list[str] = []
    for name in names:
        for picked in _all_ready() if name == "all" else [name]:
            if picked not in out:
                out.append(picked)
    return out


def _all_ready() -> list[str]:
    ready = []
    for name in get_available_reporting_integrations():
        if name in _NOT_IN_ALL:
            continue
        reason = get_reporter_class(name).skip_reason()
        if reason is None:
            ready.append(name)
        else:
            logger.info("report_to='all' leaves out %s: %s", name, reason)
    return ready


def get_reporting_integration_callbacks(report_to: str | Iterable[str] | None) -> list[type[Reporter]]:
    """The reporter classes for `report_to` (see `normalize_report_to`). A reporter named
    explicitly whose package is missing raises MissingReporterPackageError with the install hint."""
    classes = [get_reporter_class(name) for name in normalize_report_to(report_to)]
    for cls in classes:
        cls.require()
    return classes

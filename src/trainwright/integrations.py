"""`trainwright.integrations`: the names scripts import from `transformers.integrations`.

    from trainwright.integrations import WandbCallback, TensorBoardCallback, NeptuneCallback

Each callback is the reporter that `report_to` uses (`trainwright.reporters`), with transformers'
constructor and public methods (`setup(args, state, model, ...)`, `NeptuneCallback.get_run(trainer)`,
`TensorBoardCallback(tb_writer=None)`, ...). Importing this module imports no service package:
each is imported when its reporter is created. Availability helpers answer "is the package
installed" (`is_kubeflow_available`: "is the Kubeflow Trainer endpoint set"), as transformers' do,
except that `is_comet_available` does not also require a configured API key.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Mapping

from trainwright.callbacks.jit_checkpoint import JITCheckpointCallback
from trainwright.reporters import INTEGRATION_TO_CALLBACK as _REGISTRY
from trainwright.reporters import (
    Reporter,
    get_available_reporting_integrations,
    get_reporter_class,
    get_reporting_integration_callbacks,
    rewrite_logs,
)
from trainwright.reporters.azureml import AzureMLCallback
from trainwright.reporters.base import env_flag
from trainwright.reporters.clearml import ClearMLCallback
from trainwright.reporters.codecarbon import CodeCarbonCallback
from trainwright.reporters.comet import CometCallback
from trainwright.reporters.dagshub import DagsHubCallback
from trainwright.reporters.dvclive import DVCLiveCallback
from trainwright.reporters.files import CsvCallback, JsonlCallback
from trainwright.reporters.flyte import FlyteCallback
from trainwright.reporters.kubeflow import KubeflowCallback
from trainwright.reporters.mlflow import MLflowCallback
from trainwright.reporters.neptune import NeptuneCallback
from trainwright.reporters.swanlab import SwanLabCallback
from trainwright.reporters.tensorboard import TensorBoardCallback
from trainwright.reporters.wandb import WandbCallback

__all__ = [
    "INTEGRATION_TO_CALLBACK",
    "AzureMLCallback",
    "ClearMLCallback",
    "CodeCarbonCallback",
    "CometCallback",
    "CsvCallback",
    "DVCLiveCallback",
    "DagsHubCallback",
    "FlyteCallback",
    "JITCheckpointCallback",
    "JsonlCallback",
    "KubeflowCallback",
    "MLflowCallback",
    "NeptuneCallback",
    "SwanLabCallback",
    "TensorBoardCallback",
    "WandbCallback",
    "get_available_reporting_integrations",
    "get_reporting_integration_callbacks",
    "is_azureml_available",
    "is_clearml_available",
    "is_codecarbon_available",
    "is_comet_available",
    "is_dagshub_available",
    "is_dvclive_available",
    "is_flytekit_available",
    "is_kubeflow_available",
    "is_mlflow_available",
    "is_neptune_available",
    "is_optuna_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_wandb_available",
    "rewrite_logs",
]


class _CallbackClasses(Mapping[str, type[Reporter]]):
    """The `report_to` registry as transformers exposes it: name -> callback class (the registry
    itself, `trainwright.reporters.INTEGRATION_TO_CALLBACK`, stores import paths)."""

    def __getitem__(self, name: str) -> type[Reporter]:
        if name not in _REGISTRY:
            raise KeyError(name)
        return get_reporter_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {v.__name__}" for k, v in self.items()) + "}"


INTEGRATION_TO_CALLBACK: Mapping[str, type[Reporter]] = _CallbackClasses()


def _installed(cls: type[Reporter]) -> bool:
    return not cls.missing_packages()


def is_wandb_available() -> bool:
    return _installed(WandbCallback)


def is_clearml_available() -> bool:
    return _installed(ClearMLCallback)


def is_comet_available() -> bool:
    return _installed(CometCallback)


def is_tensorboard_available() -> bool:
    return _installed(TensorBoardCallback)


def is_azureml_available() -> bool:
    return _installed(AzureMLCallback)


def is_mlflow_available() -> bool:
    """mlflow is installed and DISABLE_MLFLOW_INTEGRATION is not true (as transformers)."""
    return _installed(MLflowCallback) and not env_flag("DISABLE_MLFLOW_INTEGRATION")


def is_dagshub_available() -> bool:
    return _installed(DagsHubCallback)


def is_neptune_available() -> bool:
    return _installed(NeptuneCallback)


def is_codecarbon_available() -> bool:
    return _installed(CodeCarbonCallback)


def is_flytekit_available() -> bool:
    return _installed(FlyteCallback)


def is_dvclive_available() -> bool:
    return _installed(DVCLiveCallback)


def is_swanlab_available() -> bool:
    return _installed(SwanLabCallback)


def is_kubeflow_available() -> bool:
    """Inside a Kubeflow TrainJob that reports status (the controller sets the server URL), and
    DISABLE_KUBEFLOW_INTEGRATION is not true."""
    return bool(os.environ.get(KubeflowCallback._ENV_SERVER_URL)) and not env_flag(
        "DISABLE_KUBEFLOW_INTEGRATION"
    )


def is_optuna_available() -> bool:
    """optuna (the `hyperparameter_search` backend) is installed."""
    return importlib.util.find_spec("optuna") is not None

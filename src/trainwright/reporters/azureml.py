"""Azure ML (the `azureml-core` SDK v1): numbers logged to the current Azure ML run."""

from __future__ import annotations

import os
from typing import Any

from trainwright.reporters.base import Reporter


class AzureMLCallback(Reporter):
    """Logs every number with `Run.log(name, value, description=name)` to `azureml_run`, or to
    `azureml.core.run.Run.get_context()` (the job's run inside Azure ML, an offline run that only
    prints outside it). `report_to="all"` includes it only inside an Azure ML job (`AZUREML_RUN_ID`).
    """

    name = "azure_ml"
    requires = ("azureml.core",)
    pip_name = "azureml-core"

    def __init__(self, azureml_run: Any = None) -> None:
        super().__init__()
        self.azureml_run = azureml_run

    @classmethod
    def skip_reason(cls) -> str | None:
        if not os.environ.get("AZUREML_RUN_ID"):
            return "not inside an Azure ML job (AZUREML_RUN_ID is not set)"
        return None

    def service_address(self) -> str | None:
        return None  # azureml-core batches and sends `Run.log` in its own thread

    def _ensure_run(self) -> None:
        if self.azureml_run is None:
            from azureml.core.run import Run

            self.azureml_run = Run.get_context()

    def on_init_end(self, args, state, control, **kwargs):
        self._ensure_run()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        self._ensure_run()
        scalars, texts = self.split_logs(logs)
        for key, value in texts.items():
            self.drop_once(key, value)
        for key, value in scalars.items():
            self.azureml_run.log(key, value, description=key)

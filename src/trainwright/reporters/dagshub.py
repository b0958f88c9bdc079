"""DagsHub: MLflow tracking on a DagsHub repository, plus the final model uploaded to the repo."""

from __future__ import annotations

import os
import tempfile
from typing import Any
from urllib.parse import urlparse

from trainwright.reporters.base import env_flag, export_model
from trainwright.reporters.mlflow import MLflowCallback


def parse_dagshub_uri(uri: str) -> tuple[str, str]:
    """`https://dagshub.com/<owner>/<repo>.mlflow` -> (owner, repo)."""
    parts = [p for p in urlparse(uri).path.split("/") if p]
    if len(parts) < 2 or not parts[-1].endswith(".mlflow"):
        raise ValueError(
            f"environment variable MLFLOW_TRACKING_URI={uri!r}: the dagshub reporter expects "
            "https://dagshub.com/<owner>/<repo>.mlflow (dagshub.init() sets it)"
        )
    return parts[-2], parts[-1][: -len(".mlflow")]


class DagsHubCallback(MLflowCallback):
    """Everything the MLflow reporter does, against the DagsHub repository that
    `MLFLOW_TRACKING_URI` names (required; `dagshub.init()` sets it, credentials come from
    `DAGSHUB_USER_TOKEN` or dagshub's login). With `HF_DAGSHUB_LOG_ARTIFACTS=true` the final model
    is uploaded at the end of training to `artifacts/<HF_DAGSHUB_MODEL_NAME or "main">` on branch
    `BRANCH` (default "main") of that repository.
    """

    name = "dagshub"
    requires = ("dagshub", "mlflow")
    pip_name = "dagshub mlflow-skinny"

    def __init__(self) -> None:
        super().__init__()
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise ValueError(
                "report_to='dagshub' needs the environment variable MLFLOW_TRACKING_URI="
                "https://dagshub.com/<owner>/<repo>.mlflow (dagshub.init() sets it)"
            )
        self.repo_owner, self.repo_name = parse_dagshub_uri(uri)
        self.upload_artifacts = env_flag("HF_DAGSHUB_LOG_ARTIFACTS")
        self.model_name = os.environ.get("HF_DAGSHUB_MODEL_NAME") or "main"
        self.branch = os.environ.get("BRANCH") or "main"

    @classmethod
    def skip_reason(cls) -> str | None:
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if "dagshub" not in (urlparse(uri).hostname or ""):
            return "MLFLOW_TRACKING_URI does not point to a DagsHub repository"
        return None

    def upload_model(self, model: Any) -> None:
        """Upload the model's weights to `artifacts/<model name>` of the DagsHub repository."""
        from dagshub.upload import Repo

        repo = Repo(owner=self.repo_owner, name=self.repo_name, branch=self.branch)
        with tempfile.TemporaryDirectory() as tmp:
            repo.directory(f"artifacts/{self.model_name}").add_dir(
                export_model(model, tmp), commit_message=f"trainwright: {self.model_name} model"
            )

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.upload_artifacts and model is not None and self.run_id is not None:
            self.upload_model(model)
        super().on_train_end(args, state, control, model=model, **kwargs)

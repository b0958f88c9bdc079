"""ClearML: hyperparameters, scalars per title/series, single values, checkpoints as output models."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trainwright.reporters.base import (
    SUMMARY_KEYS,
    Reporter,
    env_flag,
    model_config_dict,
    saved_checkpoint_dir,
)

logger = logging.getLogger(__name__)


def _title_and_series(key: str) -> tuple[str, str]:
    for prefix in ("eval", "test"):
        if key.startswith(prefix + "_"):
            return prefix, key[len(prefix) + 1 :]
    if "/" in key:
        title, _, series = key.partition("/")
        return title, series
    return "train", key


class ClearMLCallback(Reporter):
    """Logs to ClearML.

    The task: `Task.current_task()` if there is one (left open), else `Task.init(project_name=
    CLEARML_PROJECT or "HuggingFace Transformers", task_name=CLEARML_TASK or "Trainer")` with
    framework auto-logging off, closed at the end of training. Offline: `CLEARML_OFFLINE_MODE=1`
    (the session is written under clearml's cache folder, `CLEARML_CACHE_DIR`). Hyperparameters:
    `args.to_sanitized_dict()` in section "Args", the model config as configuration "Model
    Configuration". Scalars: title train/eval/test (or the part before "/"), series the rest, at
    `state.global_step`; the end-of-training summary as single values; strings as text.
    `CLEARML_LOG_MODEL=true`: each saved checkpoint folder becomes an output model.
    """

    name = "clearml"
    requires = ("clearml",)
    pip_name = "clearml"

    def __init__(self) -> None:
        super().__init__()
        self.log_model = env_flag("CLEARML_LOG_MODEL")
        self.offline = env_flag("CLEARML_OFFLINE_MODE")
        self.project = os.environ.get("CLEARML_PROJECT") or "HuggingFace Transformers"
        self.task_name = os.environ.get("CLEARML_TASK") or "Trainer"
        self.task: Any = None
        self._own_task = False

    @classmethod
    def skip_reason(cls) -> str | None:
        if env_flag("CLEARML_OFFLINE_MODE"):
            return None
        if os.environ.get("CLEARML_API_ACCESS_KEY") and os.environ.get("CLEARML_API_SECRET_KEY"):
            return None
        config = os.environ.get("CLEARML_CONFIG_FILE") or str(Path.home() / "clearml.conf")
        if os.path.isfile(config):
            return None
        return "no ClearML configuration (clearml.conf or CLEARML_API_* keys) and CLEARML_OFFLINE_MODE is not set"

    def service_address(self) -> str | None:
        if self.offline:
            return None
        return os.environ.get("CLEARML_API_HOST") or "the ClearML server of clearml.conf (CLEARML_API_HOST)"

    def setup(self, args: Any, state: Any, model: Any, processing_class: Any = None, **kwargs: Any) -> None:
        """Open (or join) the ClearML task and connect the arguments, as `on_train_begin` does."""
        self._setup(args, state, model)

    def _setup(self, args: Any, state: Any, model: Any) -> None:
        from clearml import Task

        if self.offline and not Task.is_offline():
            # clearml reads CLEARML_OFFLINE_MODE once, when it is first imported
            Task.set_offline(offline_mode=True)
        current: Any = Task.current_task()
        if current is not None:
            self.task, self._own_task = current, False
        else:
            task_name = self.task_name
            if state.is_hyper_param_search and state.trial_name:
                task_name = f"{task_name}-{state.trial_name}"
            self.task = Task.init(
                project_name=self.project,
                task_name=task_name,
                auto_connect_frameworks={"tensorboard": False, "pytorch": False},
                output_uri=True,
            )
            self._own_task = True
        self.task.connect(args.to_sanitized_dict(), name="Args")
        config = model_config_dict(model)
        if config is not None:
            self.task.connect_configuration(config, name="Model Configuration")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.task is None:
            self._setup(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs:
            return
        if self.task is None:
            self._setup(args, state, model)
        reporter = self.task.get_logger()
        scalars, texts = self.split_logs(logs)
        for key, value in scalars.items():
            if key in SUMMARY_KEYS:
                reporter.report_single_value(name=key, value=value)
            else:
                title, series = _title_and_series(key)
                reporter.report_scalar(title=title, series=series, value=value, iteration=state.global_step)
        for key, value in texts.items():
            reporter.report_text(f"{key}: {value}", print_console=False)

    def on_save(self, args, state, control, **kwargs):
        if not self.log_model or self.task is None:
            return
        checkpoint = saved_checkpoint_dir(args, state)
        if checkpoint is None:
            logger.warning("ClearML: no checkpoint folder for step %d to log", state.global_step)
            return
        from clearml import OutputModel

        try:
            output_model = OutputModel(task=self.task, name=os.path.basename(checkpoint), framework="PyTorch")
            output_model.update_weights_package(
                weights_path=checkpoint, auto_delete_file=False, iteration=state.global_step
            )
        except Exception as exc:
            # Model registration is an extra (clearml 2.1 cannot do it in offline mode at all):
            # losing it must not cost the metrics, so only checkpoint logging is turned off.
            self.log_model = False
            logger.warning(
                "ClearML: could not register %s as an output model (%s: %s); checkpoints will not be "
                "logged for the rest of this run, metrics still are",
                os.path.basename(checkpoint),
                type(exc).__name__,
                exc,
            )

    def on_train_end(self, args, state, control, **kwargs):
        if self.task is None:
            return
        if self._own_task:
            self.task.close()
        else:
            self.task.flush(wait_for_uploads=True)
        self.task = None
        self._own_task = False

    def close_after_failure(self) -> None:
        if self.task is not None and self._own_task:
            self.task.close()

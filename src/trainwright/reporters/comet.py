"""Comet: parameters, metrics with step and epoch, the output folder as assets; works offline."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trainwright.reporters.base import Reporter, env_flag, model_config_dict, rewrite_logs

logger = logging.getLogger(__name__)

_LAUNCH_MODES = ("get", "create", "get_or_create")


def _comet_online_setting() -> bool | None:
    """COMET_MODE (offline/online/disabled or a launch mode) and COMET_START_ONLINE as one answer:
    False = offline, True = online, None = let comet_ml decide."""
    mode = os.environ.get("COMET_MODE", "").strip().lower()
    if mode == "offline":
        return False
    if mode == "online":
        return True
    if "COMET_START_ONLINE" in os.environ:
        return env_flag("COMET_START_ONLINE")
    return None


class CometCallback(Reporter):
    """Logs to Comet.

    `COMET_MODE`: "offline" (write an archive to `COMET_OFFLINE_DIRECTORY`, comet's default
    `.cometml-runs`), "online", "disabled" (reporter off), or a launch mode get/create/get_or_create
    passed to `comet_ml.start`; `COMET_START_ONLINE=false` also means offline. `COMET_PROJECT_NAME`
    names the project. Parameters: `args.to_dict()` under the prefix "args" and the model config under
    "config". Metrics: `rewrite_logs` names at `state.global_step` with the epoch; predict() metrics
    too. `COMET_LOG_ASSETS` (default true) logs the output folder as assets at the end of training.
    An experiment already running in the process is reused and left open; one this reporter started
    stays open after training (for later evaluate() calls) and is ended between trials and at exit.
    """

    name = "comet_ml"
    requires = ("comet_ml",)
    pip_name = "comet_ml"

    def __init__(self) -> None:
        super().__init__()
        mode = os.environ.get("COMET_MODE", "").strip().lower()
        if mode and mode not in (*_LAUNCH_MODES, "offline", "online", "disabled"):
            raise ValueError(
                f"environment variable COMET_MODE={mode!r}: expected one of offline, online, disabled, "
                + ", ".join(_LAUNCH_MODES)
            )
        self.launch_mode = mode if mode in _LAUNCH_MODES else None
        self.online = _comet_online_setting()
        self.log_assets = env_flag("COMET_LOG_ASSETS", True)
        self.project_name = os.environ.get("COMET_PROJECT_NAME") or None
        self.experiment: Any = None
        self._own_experiment = False
        if mode == "disabled":
            self.disable("COMET_MODE is disabled", logging.INFO)

    @classmethod
    def skip_reason(cls) -> str | None:
        if os.environ.get("COMET_MODE", "").strip().lower() == "disabled":
            return "COMET_MODE is disabled"
        if _comet_online_setting() is False:
            return None
        config_file = os.environ.get("COMET_CONFIG") or str(Path.home() / ".comet.config")
        if os.environ.get("COMET_API_KEY") or os.path.isfile(config_file):
            return None
        return "no Comet API key (COMET_API_KEY or ~/.comet.config) and COMET_MODE is not offline"

    def service_address(self) -> str | None:
        if self.online is False:
            return None
        return os.environ.get("COMET_URL_OVERRIDE") or "https://www.comet.com (COMET_URL_OVERRIDE)"

    def setup(self, args: Any, state: Any, model: Any) -> None:
        """Start (or join) the Comet experiment and log parameters, as `on_train_begin` does."""
        self._setup(args, state, model)

    def _setup(self, args: Any, state: Any, model: Any) -> None:
        import comet_ml

        running = comet_ml.get_running_experiment()  # still returned after it ended
        if running is not None and not getattr(running, "ended", False) and not state.is_hyper_param_search:
            self.experiment, self._own_experiment = running, False
        else:
            self.experiment = comet_ml.start(
                project_name=self.project_name, mode=self.launch_mode, online=self.online
            )
            self._own_experiment = True
            name = getattr(args, "run_name", None)
            if state.is_hyper_param_search and state.trial_name:
                name = f"{name}-{state.trial_name}" if name else str(state.trial_name)
            if name:
                self.experiment.set_name(name)
        self.experiment.log_other("Created from", "trainwright")
        self.experiment.log_parameters(args.to_dict(), prefix="args")
        config = model_config_dict(model)
        if config is not None:
            self.experiment.log_parameters(config, prefix="config")

    def _log(self, state: Any, logs: dict) -> None:
        scalars, texts = self.split_logs(rewrite_logs(logs))
        for key, value in texts.items():
            self.drop_once(key, value)
        if scalars:
            self.experiment.log_metrics(scalars, step=state.global_step, epoch=state.epoch)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.experiment is None or state.is_hyper_param_search:
            self._end_own()
            self._setup(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs:
            return
        if self.experiment is None:
            self._setup(args, state, model)
        self._log(state, logs)

    def on_predict(self, args, state, control, metrics=None, model=None, **kwargs):
        if not metrics:
            return
        if self.experiment is None:
            self._setup(args, state, model)
        self._log(state, metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if self.experiment is None:
            return
        if self.log_assets and os.path.isdir(args.output_dir):
            self.experiment.log_asset_folder(
                args.output_dir, recursive=True, log_file_name=True, step=state.global_step
            )
        if state.is_hyper_param_search:
            self._end_own()

    def _end_own(self) -> None:
        if self.experiment is not None and self._own_experiment:
            self.experiment.end()
        self.experiment = None
        self._own_experiment = False

    def close_after_failure(self) -> None:
        self._end_own()

"""SwanLab: config, metrics against `train/global_step`, end-of-training summary; works offline."""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

from trainwright.reporters.base import SUMMARY_KEYS, Reporter, model_config_dict, rewrite_logs, unwrap_model

logger = logging.getLogger(__name__)

_STEP_METRIC = "train/global_step"
_UNATTENDED_MODES = ("local", "offline", "disabled")


class SwanLabCallback(Reporter):
    """Logs to SwanLab.

    The run: `swanlab.get_run()` if one is active, else `swanlab.init(project=SWANLAB_PROJECT,
    experiment_name=args.run_name)`; swanlab itself reads SWANLAB_MODE (cloud/local/offline/disabled:
    "offline" writes `backup.swanlab` under SWANLAB_LOG_DIR, default `./swanlog`, for a later
    `swanlab sync`), SWANLAB_API_KEY, SWANLAB_WORKSPACE. SWANLAB_RUN_ID / SWANLAB_RESUME (or
    `resume_from_checkpoint`, which means "allow") continue a run when the installed swanlab's
    `init` takes `id` / `resume`. In a hyperparameter search each trial is its own run named
    `<run_name>-<trial>`. Config: the model config, `args.to_dict()`, `model_num_parameters` and
    `FRAMEWORK`. Metrics: `rewrite_logs` names at `state.global_step` plus `train/global_step`;
    the end-of-training summary as `single_value/<key>`; predict() metrics too. SwanLab cannot store
    models: SWANLAB_LOG_MODEL is accepted (as transformers does) with one warning. The run stays
    open after training (so a later evaluate() logs into it; swanlab closes it at exit) except
    between trials.
    """

    name = "swanlab"
    requires = ("swanlab",)
    pip_name = "swanlab"
    extra = "swanlab"

    def __init__(self) -> None:
        super().__init__()
        self.log_model = os.environ.get("SWANLAB_LOG_MODEL") or None
        self.run: Any = None
        self._own_run = False

    @classmethod
    def skip_reason(cls) -> str | None:
        if os.environ.get("SWANLAB_MODE", "").strip() in _UNATTENDED_MODES:
            return None
        if os.environ.get("SWANLAB_API_KEY"):
            return None
        # Where `swanlab login` stores the key; read without importing swanlab, whose import creates
        # that folder (and fails when the home folder does not exist).
        save_dir = os.environ.get("SWANLAB_SAVE_DIR") or os.path.join(os.path.expanduser("~"), ".swanlab")
        if os.path.isfile(os.path.join(save_dir, ".netrc")):
            return None
        return "no SwanLab API key (SWANLAB_API_KEY or `swanlab login`) and SWANLAB_MODE is not local/offline"

    def service_address(self) -> str | None:
        if os.environ.get("SWANLAB_MODE", "").strip() in _UNATTENDED_MODES:
            return None  # local files only: events run on the training thread
        return os.environ.get("SWANLAB_API_HOST") or "the SwanLab cloud (SWANLAB_API_HOST)"

    def setup(self, args: Any, state: Any, model: Any, **kwargs: Any) -> None:
        """Start (or join) the SwanLab run and log the config, as `on_train_begin` does (transformers'
        public hook: subclass and override it to customise the run)."""
        import swanlab

        trial = state.trial_name if state.is_hyper_param_search else None
        if trial is not None and self._own_run and self.run is not None:
            swanlab.finish()  # the previous trial's run
            self.run, self._own_run = None, False
        active = swanlab.get_run()
        if active is not None and trial is None:
            self.run, self._own_run = active, False
        else:
            self.run, self._own_run = swanlab.init(**self._init_kwargs(args, trial, swanlab.init)), True
        config = {**(model_config_dict(model) or {}), **args.to_dict()}
        module = unwrap_model(model)
        if module is not None and hasattr(module, "parameters"):
            config["model_num_parameters"] = sum(p.numel() for p in module.parameters())
        config["FRAMEWORK"] = "trainwright"
        swanlab.config.update(config)
        if self.log_model is not None:
            logger.warning("SwanLab cannot store models: SWANLAB_LOG_MODEL=%s is ignored", self.log_model)
            self.log_model = None  # said once

    @staticmethod
    def _init_kwargs(args: Any, trial: str | None, init: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"project": os.environ.get("SWANLAB_PROJECT") or None}
        run_name = getattr(args, "run_name", None)
        if trial is not None:
            kwargs["experiment_name"] = f"{run_name}-{trial}" if run_name else str(trial)
        elif run_name:
            kwargs["experiment_name"] = run_name
        wanted = {
            "id": os.environ.get("SWANLAB_RUN_ID") or None,
            "resume": os.environ.get("SWANLAB_RESUME") or None,
        }
        if wanted["resume"] is None and getattr(args, "resume_from_checkpoint", None):
            wanted["resume"] = "allow"
        # swanlab's init swallows unknown keywords, so an unsupported one would be ignored silently.
        accepted = inspect.signature(init).parameters
        for key, value in wanted.items():
            if value is None:
                continue
            if key in accepted:
                kwargs[key] = value
            elif key == "id" or os.environ.get("SWANLAB_RESUME"):
                raise ValueError(
                    f"SWANLAB_RUN_ID/SWANLAB_RESUME: the installed swanlab's init() has no {key!r} argument, "
                    "so the run cannot be continued; upgrade swanlab or unset the variable"
                )
        return kwargs

    def _log(self, state: Any, logs: dict) -> None:
        import swanlab

        summary = {k: v for k, v in logs.items() if k in SUMMARY_KEYS}
        rest = {k: v for k, v in logs.items() if k not in SUMMARY_KEYS}
        single, texts = self.split_logs(summary)
        scalars, more_texts = self.split_logs(rewrite_logs(rest))
        for key, value in {**texts, **more_texts}.items():
            self.drop_once(key, value)  # swanlab.log takes numbers and swanlab media, not strings
        row = {f"single_value/{k}": v for k, v in single.items()}
        row.update(scalars)
        if row:
            row[_STEP_METRIC] = state.global_step
            swanlab.log(row, step=state.global_step)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.run is None or state.is_hyper_param_search:
            self.setup(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs:
            return
        if self.run is None:
            self.setup(args, state, model)
        self._log(state, logs)

    def on_predict(self, args, state, control, metrics=None, model=None, **kwargs):
        if not metrics:
            return
        if self.run is None:
            self.setup(args, state, model)
        self._log(state, metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if self.run is not None and state.is_hyper_param_search and self._own_run:
            import swanlab

            swanlab.finish()
            self.run, self._own_run = None, False

    def close_after_failure(self) -> None:
        if self.run is not None and self._own_run:
            import swanlab

            if swanlab.get_run() is not None:
                swanlab.finish()
        self.run, self._own_run = None, False

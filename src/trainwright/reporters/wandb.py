"""Weights & Biases: config, metrics against `train/global_step`, model/checkpoint artifacts."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from trainwright.reporters.base import (
    SUMMARY_KEYS,
    Reporter,
    env_choice,
    env_flag,
    export_model,
    model_config_dict,
    rewrite_logs,
    saved_checkpoint_dir,
    unwrap_model,
)

logger = logging.getLogger(__name__)

_STEP_METRIC = "train/global_step"


def _has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


class WandbCallback(Reporter):
    """Logs to Weights & Biases.

    The run: `wandb.run` if one is active, else `wandb.init(project=WANDB_PROJECT or "huggingface",
    name=args.run_name)` (wandb itself reads WANDB_MODE, WANDB_DIR, WANDB_ENTITY, WANDB_RUN_ID,
    WANDB_RESUME...). In a hyperparameter search each trial is its own run, named after the trial
    and grouped under `args.run_name`. Config: the model config, `args.to_dict()` and
    `model/num_parameters`. Metrics use `rewrite_logs` names against the step metric
    `train/global_step`; the end-of-training summary goes to the run summary. `WANDB_WATCH`
    (false/gradients/parameters/all) calls `wandb.watch`; `WANDB_LOG_MODEL` (false/end/checkpoint;
    "true" means "end") logs each saved checkpoint ("checkpoint") and the final model (both) as
    `model-<run id>` artifacts. `WANDB_DISABLED=true` turns the reporter off. The run stays open
    after training (so a later evaluate() logs into it) except between trials.
    """

    name = "wandb"
    requires = ("wandb",)
    pip_name = "wandb"
    extra = "wandb"

    def __init__(self) -> None:
        super().__init__()
        self.log_model = env_choice(
            "WANDB_LOG_MODEL", ("false", "end", "checkpoint"), "false", {"true": "end"}
        )
        self.watch = env_choice("WANDB_WATCH", ("false", "gradients", "parameters", "all"), "false")
        self.run: Any = None
        self._own_run = False
        if env_flag("WANDB_DISABLED"):
            self.disable("WANDB_DISABLED is set", logging.INFO)

    @classmethod
    def skip_reason(cls) -> str | None:
        if env_flag("WANDB_DISABLED"):
            return "WANDB_DISABLED is set"
        mode = os.environ.get("WANDB_MODE", "").strip().lower()
        if mode in ("offline", "dryrun", "disabled"):
            return None
        if not _has_wandb_credentials():
            return "no W&B credentials (WANDB_API_KEY or `wandb login`) and WANDB_MODE is not offline"
        return None

    def service_address(self) -> str | None:
        mode = os.environ.get("WANDB_MODE", "").strip().lower()
        if mode in ("offline", "dryrun", "disabled"):
            return None
        return os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai (WANDB_BASE_URL)"

    def setup(self, args: Any, state: Any, model: Any, **kwargs: Any) -> None:
        """Start (or join) the W&B run and log the config, as `on_train_begin` does (transformers'
        public hook: subclass and override it to customise the run)."""
        self._setup(args, state, model)

    def _setup(self, args: Any, state: Any, model: Any) -> None:
        import wandb

        trial = state.trial_name if state.is_hyper_param_search else None
        if trial is not None and self._own_run and self.run is not None:
            self.run.finish()  # the previous trial's run
            self.run = None
        if wandb.run is not None and trial is None:
            self.run, self._own_run = wandb.run, False
        else:
            init: dict[str, Any] = {"project": os.environ.get("WANDB_PROJECT") or "huggingface"}
            if trial is not None:
                init["name"] = str(trial)
                if getattr(args, "run_name", None):
                    init["group"] = args.run_name
            elif getattr(args, "run_name", None):
                init["name"] = args.run_name
            self.run, self._own_run = wandb.init(**init), True
        config = {**(model_config_dict(model) or {}), **args.to_dict()}
        module = unwrap_model(model)
        if module is not None and hasattr(module, "parameters"):
            config["model/num_parameters"] = sum(p.numel() for p in module.parameters())
        self.run.config.update(config, allow_val_change=True)
        self.run.define_metric(_STEP_METRIC)
        self.run.define_metric("*", step_metric=_STEP_METRIC, step_sync=True)
        if self.watch != "false" and module is not None:
            self.run.watch(module, log=self.watch, log_freq=max(100, state.logging_steps))

    def _log(self, state: Any, logs: dict) -> None:
        summary = {k: v for k, v in logs.items() if k in SUMMARY_KEYS}
        rest = {k: v for k, v in logs.items() if k not in SUMMARY_KEYS}
        scalars, texts = self.split_logs(summary)
        for key, value in {**scalars, **texts}.items():
            self.run.summary[key] = value
        scalars, texts = self.split_logs(rewrite_logs(rest))
        if scalars or texts:
            self.run.log({**scalars, **texts, _STEP_METRIC: state.global_step})

    def _log_model_artifact(self, directory: str, aliases: list[str], metadata: dict) -> None:
        import wandb

        artifact = wandb.Artifact(name=f"model-{self.run.id}", type="model", metadata=metadata)
        artifact.add_dir(directory)
        self.run.log_artifact(artifact, aliases=aliases)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._setup(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs:
            return
        if self.run is None:
            self._setup(args, state, model)
        self._log(state, logs)

    def on_predict(self, args, state, control, metrics=None, model=None, **kwargs):
        if not metrics:
            return
        if self.run is None:
            self._setup(args, state, model)
        self._log(state, metrics)

    def on_save(self, args, state, control, **kwargs):
        if self.log_model != "checkpoint" or self.run is None:
            return
        checkpoint = saved_checkpoint_dir(args, state)
        if checkpoint is None:
            logger.warning("W&B: no checkpoint folder for step %d to log", state.global_step)
            return
        last = state.log_history[-1] if state.log_history else {}
        metadata = {k: v for k, v in last.items() if k.startswith("eval_")}
        metadata["global_step"] = state.global_step
        self._log_model_artifact(checkpoint, [f"checkpoint-{state.global_step}"], metadata)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.run is None:
            return
        if self.log_model != "false" and model is not None:
            with tempfile.TemporaryDirectory() as tmp:
                metadata = {"global_step": state.global_step}
                self._log_model_artifact(export_model(model, tmp), ["final"], metadata)
        if state.is_hyper_param_search and self._own_run:
            self.run.finish()
            self.run = None

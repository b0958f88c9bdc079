"""DVCLive: parameters, metrics (plots and summary) at `state.global_step`, models as artifacts."""

from __future__ import annotations

import logging
import os
from typing import Any

from trainwright.reporters.base import Reporter, env_choice, export_model, rewrite_logs, saved_checkpoint_dir

logger = logging.getLogger(__name__)


class DVCLiveCallback(Reporter):
    """Logs with DVCLive.

    `live`: a `dvclive.Live` to use (left open), else one is created at the start of training with
    `live_kwargs` (defaults: `dir=output_dir/dvclive`, `save_dvc_exp=False`, and `resume=True` when
    training resumes from a checkpoint, so earlier steps are kept). Parameters: `args.to_dict()`.
    Metrics: `rewrite_logs` names, the step set to `state.global_step`, the summary (`metrics.json`)
    rewritten after each log. `log_model` (default from `HF_DVCLIVE_LOG_MODEL`): "all" logs each
    saved checkpoint folder as an artifact, True logs the final model (exported to
    `output_dir/dvclive_model`) at the end, False nothing; artifacts need a DVC repository.
    """

    name = "dvclive"
    requires = ("dvclive",)
    pip_name = "dvclive"

    def __init__(self, live: Any = None, log_model: str | bool | None = None, **live_kwargs: Any) -> None:
        super().__init__()
        if log_model is None:
            log_model = env_choice(
                "HF_DVCLIVE_LOG_MODEL", ("false", "true", "all"), "false", {"1": "true", "0": "false"}
            )
        if isinstance(log_model, str):
            if log_model.lower() not in ("all", "true", "false"):
                raise ValueError(f"DVCLiveCallback(log_model={log_model!r}): expected 'all', True or False")
            log_model = "all" if log_model.lower() == "all" else log_model.lower() == "true"
        self.log_model: str | bool = log_model
        self.live = live
        self._own_live = False
        self.live_kwargs = live_kwargs

    def service_address(self) -> str | None:
        # Local files, unless DVC Studio live updates are configured (dvclive then posts to Studio).
        if os.environ.get("DVC_STUDIO_TOKEN") or os.environ.get("STUDIO_TOKEN"):
            return os.environ.get("DVC_STUDIO_URL") or "https://studio.datachain.ai (DVC Studio)"
        return None

    def _setup(self, args: Any, state: Any) -> None:
        from dvclive import Live

        kwargs: dict[str, Any] = {"dir": os.path.join(args.output_dir, "dvclive"), "save_dvc_exp": False}
        if state.global_step > 0:
            kwargs["resume"] = True
        kwargs.update(self.live_kwargs)
        self.live = Live(**kwargs)
        self._own_live = True

    def setup(self, args: Any, state: Any, model: Any = None) -> None:
        """Create the `Live` (unless one was given) and log the arguments, as `on_train_begin` does."""
        if self.live is None:
            self._setup(args, state)
        params = {
            k: v for k, v in args.to_dict().items() if isinstance(v, (bool, int, float, str, type(None)))
        }
        self.live.log_params(params)

    def on_train_begin(self, args, state, control, **kwargs):
        self.setup(args, state, kwargs.get("model"))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        if self.live is None:
            self._setup(args, state)
        scalars, texts = self.split_logs(rewrite_logs(logs))
        for key, value in texts.items():
            self.drop_once(key, value)
        self.live.step = state.global_step
        for key, value in scalars.items():
            self.live.log_metric(key, value)
        self.live.make_summary()

    def on_save(self, args, state, control, **kwargs):
        if self.log_model != "all" or self.live is None:
            return
        checkpoint = saved_checkpoint_dir(args, state)
        if checkpoint is None:
            logger.warning("DVCLive: no checkpoint folder for step %d to log", state.global_step)
            return
        self.live.log_artifact(checkpoint, type="model", name=f"checkpoint-{state.global_step}", copy=False)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.live is None:
            return
        if self.log_model is True and model is not None:
            directory = export_model(model, os.path.join(args.output_dir, "dvclive_model"))
            self.live.log_artifact(directory, type="model", name="model", copy=False)
        if self._own_live:
            self.live.end()
            self.live = None
            self._own_live = False

    def close_after_failure(self) -> None:
        if self.live is not None and self._own_live:
            self.live.end()

"""Neptune (the `neptune` 1.x client): parameters, metric series, checkpoint uploads; works offline."""

from __future__ import annotations

import logging
import os
from typing import Any

from trainwright.reporters.base import Reporter, model_config_dict, rewrite_logs, saved_checkpoint_dir

logger = logging.getLogger(__name__)

_CHECKPOINT_MODES = (None, "same", "last", "best")


class NeptuneCallback(Reporter):
    """Logs to Neptune under `base_namespace` ("finetuning").

    The run: `run` if given (left open), else `neptune.init_run(project=..., api_token=..., name=...)`
    with `NEPTUNE_PROJECT` / `NEPTUNE_API_TOKEN` as defaults and `NEPTUNE_MODE` (e.g. "offline",
    written under `./.neptune`) read by neptune itself; extra keyword arguments go to `init_run`.
    Parameters (`log_parameters`): `args.to_sanitized_dict()` under `trainer_parameters`, the model
    config under `model_parameters`, the trial name and parameters in a search. Metrics: series
    `<ns>/<rewrite_logs name>` appended at `state.global_step`. `log_checkpoints`: "same" uploads
    every saved checkpoint, "last" keeps only the newest, "best" only the best one, None none.
    A run this reporter created is stopped at the end of training.
    """

    name = "neptune"
    requires = ("neptune",)
    pip_name = "neptune"

    def __init__(
        self,
        *,
        api_token: str | None = None,
        project: str | None = None,
        name: str | None = None,
        base_namespace: str = "finetuning",
        run: Any = None,
        log_parameters: bool = True,
        log_checkpoints: str | None = None,
        **neptune_run_kwargs: Any,
    ) -> None:
        super().__init__()
        if log_checkpoints not in _CHECKPOINT_MODES:
            raise ValueError(
                f"NeptuneCallback(log_checkpoints={log_checkpoints!r}): expected None, same, last or best"
            )
        self.api_token = api_token
        self.project = project
        self.run_name = name
        self.base_namespace = base_namespace.strip("/")
        self.run = run
        self._own_run = False
        self.log_parameters = log_parameters
        self.log_checkpoints = log_checkpoints
        self.run_kwargs = neptune_run_kwargs
        self._uploaded_checkpoint: str | None = None

    @classmethod
    def skip_reason(cls) -> str | None:
        mode = os.environ.get("NEPTUNE_MODE", "").strip().lower()
        if mode in ("offline", "debug"):
            return None
        if not os.environ.get("NEPTUNE_API_TOKEN"):
            return "no NEPTUNE_API_TOKEN and NEPTUNE_MODE is not offline or debug"
        return None

    def service_address(self) -> str | None:
        mode = str(self.run_kwargs.get("mode") or os.environ.get("NEPTUNE_MODE", "")).strip().lower()
        if mode in ("offline", "debug"):
            return None
        return "the Neptune server of NEPTUNE_API_TOKEN"

    def _key(self, *parts: str) -> str:
        return "/".join((self.base_namespace, *parts))

    def _ensure_run(self, args: Any, state: Any) -> None:
        if self.run is not None:
            return
        import neptune

        name = self.run_name or getattr(args, "run_name", None)
        if state.is_hyper_param_search and state.trial_name:
            name = f"{name}-{state.trial_name}" if name else str(state.trial_name)
        self.run = neptune.init_run(
            project=self.project or os.environ.get("NEPTUNE_PROJECT"),
            api_token=self.api_token or os.environ.get("NEPTUNE_API_TOKEN"),
            name=name,
            **self.run_kwargs,
        )
        self._own_run = True

    @classmethod
    def get_run(cls, trainer: Any) -> Any:
        """The Neptune run of the NeptuneCallback attached to `trainer` (created now if training
        has not started yet), for logging more into it."""
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, cls):
                callback.flush()  # the worker may be creating the run right now
                callback._ensure_run(trainer.args, trainer.state)
                return callback.run
        raise ValueError("The trainer doesn't have a NeptuneCallback configured.")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._ensure_run(args, state)
        if not self.log_parameters:
            return
        from neptune.utils import stringify_unsupported

        self.run[self._key("trainer_parameters")] = stringify_unsupported(args.to_sanitized_dict())
        config = model_config_dict(model)
        if config is not None:
            self.run[self._key("model_parameters")] = stringify_unsupported(config)
        if state.is_hyper_param_search:
            if state.trial_name is not None:
                self.run[self._key("trial")] = str(state.trial_name)
            if state.trial_params:
                self.run[self._key("trial_params")] = stringify_unsupported(state.trial_params)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        self._ensure_run(args, state)
        scalars, texts = self.split_logs(rewrite_logs(logs))
        for key, value in {**scalars, **texts}.items():
            self.run[self._key(key)].append(value, step=state.global_step)

    def on_save(self, args, state, control, **kwargs):
        if self.log_checkpoints is None or self.run is None:
            return
        checkpoint = saved_checkpoint_dir(args, state)
        if checkpoint is None:
            logger.warning("Neptune: no checkpoint folder for step %d to upload", state.global_step)
            return
        name = os.path.basename(checkpoint)
        if self.log_checkpoints == "best":
            best = state.best_model_checkpoint
            if best is None or os.path.basename(os.path.normpath(best)) != name:
                return
        if self.log_checkpoints in ("last", "best") and self._uploaded_checkpoint is not None:
            del self.run[self._key("checkpoints", self._uploaded_checkpoint)]
        self.run[self._key("checkpoints", name)].upload_files(os.path.join(checkpoint, "*"))
        self._uploaded_checkpoint = name

    def on_train_end(self, args, state, control, **kwargs):
        if self.run is not None and self._own_run:
            self.run.stop()
            self.run = None
            self._own_run = False
            self._uploaded_checkpoint = None

    def close_after_failure(self) -> None:
        if self.run is not None and self._own_run:
            self.run.stop()

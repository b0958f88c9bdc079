"""TensorBoard: scalars and text through `torch.utils.tensorboard.SummaryWriter`, without importing
TensorFlow (`core.third_party.tensorboard_without_tensorflow`)."""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime
from typing import Any

from trainwright.core.third_party import tensorboard_without_tensorflow
from trainwright.reporters.base import Reporter, model_config_dict, rewrite_logs


def default_logdir(output_dir: str) -> str:
    """`output_dir/runs/<Mon DD_HH-MM-SS>_<host>`, TensorBoard's usual run folder."""
    stamp = datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join(output_dir, "runs", f"{stamp}_{socket.gethostname()}")


def _hparam_value(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) else str(value)


class TensorBoardCallback(Reporter):
    """Writes every logged number as a scalar at `state.global_step`, strings as text, the
    arguments as text and as TensorBoard hparams, and the model config as text.

    Folder: `TENSORBOARD_LOGGING_DIR`, else `args.logging_dir`, else `default_logdir(output_dir)`,
    chosen once (an `evaluate()` after `train()` writes into the same run, as upstream); one
    subfolder per trial in a hyperparameter search. A writer passed in is used as is (flushed,
    not closed, at the end of training); one this reporter made is closed then.
    """

    name = "tensorboard"
    requires = ("tensorboard",)
    pip_name = "tensorboard"
    extra = "tensorboard"

    def __init__(self, tb_writer: Any = None) -> None:
        super().__init__()
        self.tb_writer = tb_writer
        self._own_writer = False
        self._default_dir: str | None = None  # chosen once: a later evaluate() writes beside train()

    def service_address(self) -> str | None:
        return None  # local event files: written on the training thread

    def log_dir(self, args: Any, state: Any) -> str:
        """Where this run's event files go."""
        log_dir = os.environ.get("TENSORBOARD_LOGGING_DIR") or getattr(args, "logging_dir", None)
        if not log_dir:
            if self._default_dir is None:
                self._default_dir = default_logdir(args.output_dir)
            log_dir = self._default_dir
        if state.is_hyper_param_search and state.trial_name:
            log_dir = os.path.join(log_dir, str(state.trial_name))
        return log_dir

    def _ensure_writer(self, args: Any, state: Any) -> None:
        if self.tb_writer is None:
            tensorboard_without_tensorflow()
            from torch.utils.tensorboard import SummaryWriter

            self.tb_writer = SummaryWriter(log_dir=self.log_dir(args, state))
            self._own_writer = True

    def _write_hparams(self, args: Any) -> None:
        hparams = {k: _hparam_value(v) for k, v in args.to_sanitized_dict().items()}
        file_writer = getattr(self.tb_writer, "file_writer", None)
        if file_writer is None:  # another writer class (e.g. tensorboardX): use its own method
            self.tb_writer.add_hparams(hparams, metric_dict={})
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        # SummaryWriter.add_hparams would open a second writer in a subfolder; TensorBoard reads
        # a folder's event files one after the other, so keep everything in the run's one file.
        for summary in hparams_summary(hparams, metric_dict={}):
            file_writer.add_summary(summary)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._ensure_writer(args, state)
        self.tb_writer.add_text("args", args.to_json_string())
        config = model_config_dict(model)
        if config is not None:
            self.tb_writer.add_text("model_config", json.dumps(config, indent=2, sort_keys=True, default=str))
        self._write_hparams(args)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        self._ensure_writer(args, state)
        scalars, texts = self.split_logs(rewrite_logs(logs))
        for key, value in scalars.items():
            self.tb_writer.add_scalar(key, value, state.global_step)
        for key, value in texts.items():
            self.tb_writer.add_text(key, value, state.global_step)
        self.tb_writer.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self.tb_writer is None:
            return
        if self._own_writer:
            self.tb_writer.close()
            self.tb_writer = None  # reopened in the same folder (a trial: its own subfolder)
            self._own_writer = False
        else:
            self.tb_writer.flush()

    def close_after_failure(self) -> None:
        if self.tb_writer is not None and self._own_writer:
            self.tb_writer.close()

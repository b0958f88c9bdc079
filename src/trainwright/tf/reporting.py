"""TensorBoard for TFTrainer through `tf.summary` (the shared reporter writes with PyTorch's writer)."""

from __future__ import annotations

import json
from typing import Any

import tensorflow as tf

from trainwright.reporters.base import model_config_dict, rewrite_logs
from trainwright.reporters.tensorboard import TensorBoardCallback


class TFTensorBoardCallback(TensorBoardCallback):
    """`report_to="tensorboard"` (or a `tb_writer` given to TFTrainer) for TensorFlow runs.

    The shared reporter's rules (folder: TENSORBOARD_LOGGING_DIR, else `logging_dir`, else
    `output_dir/runs/<date>_<host>`; scalars under `rewrite_logs` names at `state.global_step`,
    strings and the arguments as text; a writer passed in is flushed, not closed) with a
    `tf.summary` writer instead of PyTorch's.
    """

    requires = ("tensorflow",)
    pip_name = "tensorflow-cpu"
    extra = "tf"

    def _ensure_writer(self, args: Any, state: Any) -> None:
        if self.tb_writer is None:
            self.tb_writer = tf.summary.create_file_writer(self.log_dir(args, state))
            self._own_writer = True

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._ensure_writer(args, state)
        with self.tb_writer.as_default(step=state.global_step):
            tf.summary.text("args", args.to_json_string())
            config = model_config_dict(model)
            if config is not None:
                tf.summary.text("model_config", json.dumps(config, indent=2, sort_keys=True, default=str))
        self.tb_writer.flush()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        self._ensure_writer(args, state)
        scalars, texts = self.split_logs(rewrite_logs(logs))
        with self.tb_writer.as_default(step=state.global_step):
            for key, value in scalars.items():
                tf.summary.scalar(key, value)
            for key, value in texts.items():
                tf.summary.text(key, value)
        self.tb_writer.flush()

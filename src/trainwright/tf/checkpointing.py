"""TFTrainer checkpoints: `tf.train.Checkpoint` files inside trainwright's atomic checkpoint folder.

`output_dir/checkpoint-<step>/` holds `tf_checkpoint.index` + `tf_checkpoint.data-*` (model
variables, including Keras seed-generator states, and the optimizer's slots and iteration count),
`trainer_state.json`, `training_args.json`, `data_state.json` (epoch, batch in the epoch, the
unlogged step losses) and `checkpoint_complete.json` (the manifest, written last). The folder is
written by `trainwright.checkpoint.write_checkpoint`: aside, fsynced, renamed; rotation and
discovery are the PyTorch side's too. No file is in pickle's format (no training_args.bin, no .pt).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

import tensorflow as tf

from trainwright.checkpoint import (
    DATA_STATE_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    CheckpointError,
    read_json,
    verify_checkpoint,
    write_checkpoint,
    write_json,
)
from trainwright.checkpoint.files import TF_CHECKPOINT_PREFIX
from trainwright.core.state import TrainerState

logger = logging.getLogger(__name__)


def _rng_variables(model: Any) -> list[Any]:
    """The model's variables that are not weights: Keras seed-generator states (e.g. Dropout's),
    which `tf.train.Checkpoint` does not reach through the model (SeedGenerator is not trackable)."""
    weights = {id(v) for v in model.weights}
    return [v.value for v in model.variables if id(v) not in weights]


def tracked(model: Any, optimizer: Any = None) -> tf.train.Checkpoint:
    """The objects a checkpoint holds."""
    parts: dict[str, Any] = {"model": model, "rng": _rng_variables(model)}
    if optimizer is not None:
        parts["optimizer"] = optimizer
    return tf.train.Checkpoint(**parts)


def save(
    output_dir: str,
    name: str,
    model: Any,
    optimizer: Any,
    state: Any,
    args: Any,
    data_state: dict[str, Any],
    is_chief: bool,
) -> str | None:
    """Write checkpoint `name` atomically; returns its path on the chief, None on other workers.

    Every worker calls this: with several workers the variables' values are read collectively, so
    the other workers write the same files into a throwaway folder, as TensorFlow asks.
    """
    ckpt = tracked(model, optimizer)
    if not is_chief:
        scratch = tempfile.mkdtemp(prefix=".tf-worker-ckpt-")
        try:
            ckpt.write(os.path.join(scratch, TF_CHECKPOINT_PREFIX))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    def write_files(folder: str) -> None:
        ckpt.write(os.path.join(folder, TF_CHECKPOINT_PREFIX))
        state.save_to_json(os.path.join(folder, TRAINER_STATE_NAME))
        args.to_json_file(os.path.join(folder, TRAINING_ARGS_NAME))
        write_json(os.path.join(folder, DATA_STATE_NAME), data_state)

    return write_checkpoint(output_dir, name, write_files)


def check(path: str, need_optimizer: bool = True) -> None:
    """Raise CheckpointError naming what is missing or damaged in checkpoint folder `path`."""
    problems = verify_checkpoint(path)
    needed = [TF_CHECKPOINT_PREFIX + ".index", TRAINER_STATE_NAME]
    if need_optimizer:
        needed.append(DATA_STATE_NAME)
    problems += [f"{n} is missing" for n in needed if not os.path.isfile(os.path.join(path, n))]
    if problems:
        raise CheckpointError(f"cannot resume from {path}: " + "; ".join(problems))


def restore(path: str, model: Any, optimizer: Any = None) -> None:
    """Read model (and optimizer) variables from checkpoint folder `path`; every saved value must
    find its variable and every variable its value."""
    status = tracked(model, optimizer).read(os.path.join(path, TF_CHECKPOINT_PREFIX))
    if optimizer is None:
        status.expect_partial()  # the optimizer's values stay unread: only the weights are wanted
        status.assert_existing_objects_matched()
    else:
        status.assert_consumed()


def read_data_state(path: str) -> dict[str, Any]:
    return read_json(os.path.join(path, DATA_STATE_NAME))


def resume(trainer: Any, path: str) -> tuple[int, int]:
    """Load checkpoint folder `path` into a TFTrainer (variables, state, loss window); returns the
    (epoch, batch in the epoch) to continue from."""
    check(path)
    data = read_data_state(path)
    if data.get("has_optimizer") is False:
        raise ValueError(
            f"{path} was saved with save_only_model=True: it holds no optimizer state to resume from"
        )
    restore(path, trainer.model, trainer.optimizer)
    if data.get("step_batch") != trainer._step_batch():
        raise ValueError(
            f"{path} was written with {data.get('step_batch')} samples per step; this run has "
            f"{trainer._step_batch()} (batch size x accumulation x replicas must match to resume)"
        )
    trainer.state = TrainerState.load_from_json(os.path.join(path, TRAINER_STATE_NAME))
    trainer.global_step = trainer.state.global_step
    trainer.epoch_logging = float(trainer.state.epoch or 0.0)
    trainer._loss_window = [tf.constant(v, tf.float32) for v in data["loss_window"]]
    trainer._loss_logged_total = float(data["loss_logged_total"])
    steps = int(trainer.optimizer.iterations.numpy())
    if steps != trainer.global_step:
        raise ValueError(f"{path}: the optimizer made {steps} steps, the state says {trainer.global_step}")
    # A save at an epoch's last batch resumes into that epoch with nothing left to read, so the
    # epoch's end events still fire, as they did in the run that saved.
    epoch, batch = int(data["epoch"]), int(data["batch_in_epoch"])
    if trainer.args.ignore_data_skip:
        batch = 0
    logger.info("resuming from %s at step %d (epoch %d, batch %d)", path, trainer.global_step, epoch, batch)
    return epoch, batch

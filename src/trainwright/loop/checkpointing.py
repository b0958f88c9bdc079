"""The loop's side of checkpoints: what a checkpoint of this Trainer holds (the mapping of parts it
hands to `trainwright.checkpoint.manager`), and saving and restoring it; which folder to resume and
the rules that decide whether it fits this run are in `resume.py`.

The files, formats, atomic folders and rotation are the checkpoint layer's; the model/optimizer
state in a backend's own format is the engine's (`trainwright.distributed.engine`). Parts:
"model" (weights, config, training_args.json, processing class, through the Trainer's overridable
`_save` / `save_model`), the engine's ("optimizer", or "sharded" DCP folders, or "deepspeed"),
"scheduler", "scaler", "rng", "data_state" (the cursor with the sampler position and the loss
window) and "trainer_state" (TrainerState with the stateful callbacks).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

import trainwright.checkpoint as ckpt
from trainwright.checkpoint.manager import CheckpointManager
from trainwright.checkpoint.rng import RngState
from trainwright.checkpoint.weights import model_state_dict
from trainwright.core.events import CallbackHandler
from trainwright.core.state import ExportableState, LoopCursor, TrainerControl, TrainerState
from trainwright.distributed import fsdp
from trainwright.distributed.engine import Engine
from trainwright.loop.resume import (
    POSITION_ARGS,
    ResumingTrainer,
    check_optimizer_matches,
    check_position_args,
    cursor_from_global_step,
    keep_saved_data_order,
    keep_saved_schedule,
    optimizer_of,
    rescale_position,
    use_own_loss_window,
)
from trainwright.modeling.loss import LossWindow

logger = logging.getLogger(__name__)


class CheckpointedTrainer(ResumingTrainer, Protocol):
    """What checkpoints need of the Trainer (a Protocol, so this module never imports the Trainer)."""

    control: TrainerControl
    callback_handler: CallbackHandler
    model: nn.Module
    scaler: torch.amp.GradScaler | None
    processing_class: Any
    data_collator: Any
    hp_search_backend: str | None
    _trial: Any
    _engine: Engine | None
    _losses: LossWindow

    def store_flos(self) -> None: ...
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None: ...
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None: ...
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None: ...
    def _overrides(self, name: str) -> bool: ...
    def _hp_trial_record(self, trial: Any) -> tuple[str, dict[str, Any]]: ...
    def _load_rng_state(self, checkpoint: str | None) -> None: ...


def run_dir(trainer: CheckpointedTrainer) -> str:
    output_dir = trainer.args.output_dir
    assert output_dir is not None  # TrainingArguments.__post_init__ fills it in
    trial = trainer._trial
    if trial is None or trainer.hp_search_backend is None:
        return output_dir
    return os.path.join(output_dir, trainer._hp_trial_record(trial)[0])


def _engine(trainer: CheckpointedTrainer) -> Engine:
    """The engine of the current train() call, which is set up before a checkpoint is saved or loaded."""
    if trainer._engine is None:
        raise RuntimeError(
            "The Trainer has no engine: train() sets it up before a checkpoint is saved or loaded."
        )
    return trainer._engine


# ---------------------------------------------------------------------- callbacks' state
def callback_states(trainer: CheckpointedTrainer) -> dict[str, Any]:
    """{ClassName: {"args", "attributes"}} of callbacks that export state, plus TrainerControl."""
    states: dict[str, Any] = {}
    for cb in [*trainer.callback_handler.callbacks, trainer.control]:
        if not isinstance(cb, ExportableState) or not callable(getattr(cb, "state", None)):
            continue
        name = type(cb).__name__
        if name in states:
            existing = states[name]
            states[name] = [*(existing if isinstance(existing, list) else [existing]), cb.state()]
        else:
            states[name] = cb.state()
    return states


def _restore_callback_states(trainer: CheckpointedTrainer, saved: dict[str, Any]) -> None:
    """Put saved attributes back into the live callbacks of the same class (by order for several
    of one class). With `restore_callback_states_from_checkpoint` constructor args and the
    TrainerControl come back too, as upstream does."""
    full = trainer.args.restore_callback_states_from_checkpoint
    by_class: dict[str, list] = {}
    for cb in trainer.callback_handler.callbacks:
        by_class.setdefault(type(cb).__name__, []).append(cb)
    for name, value in saved.items():
        entries = value if isinstance(value, list) else [value]
        if name == "TrainerControl":
            if full:
                for k, v in entries[0].get("args", {}).items():
                    setattr(trainer.control, k, v)
            continue
        live = by_class.get(name, [])
        if not live:
            logger.warning("Checkpoint has state for callback %s, which this Trainer does not have.", name)
            continue
        for cb, entry in zip(live, entries):
            if full:
                new = type(cb)(**entry.get("args", {}))
                trainer.callback_handler.remove_callback(cb)
                trainer.callback_handler.add_callback(new)
                cb = new
            for k, v in entry.get("attributes", {}).items():
                setattr(cb, k, v)


# ---------------------------------------------------------------------- the parts
class ModelFiles:
    """The "model" part: weights (or, where the engine holds them in its own format, the model's
    config only), training_args.json and the processing class, through the Trainer's overridable
    `_save` / `save_model` so that a subclass's override writes them."""

    def __init__(self, trainer: CheckpointedTrainer, main: bool = False) -> None:
        self.trainer, self.main = trainer, main
        self.describe_only = self.custom = False
        self.weights: dict | None = None

    @classmethod
    def for_save(cls, trainer: CheckpointedTrainer, main: bool) -> ModelFiles:
        part = cls(trainer, main)
        engine = _engine(trainer)
        part.describe_only = engine.weights_in_own_format  # FSDP2: the DCP folders hold the weights
        part.custom = trainer._overrides("save_model")
        if not (part.custom or part.describe_only):  # DeepSpeed ZeRO-3 gathers now, on every rank
            part.weights = engine.full_state_dict()
        return part

    def save(self, folder: str) -> None:
        if self.main and self.describe_only:
            write_model(self.trainer, folder, weights=False)
        elif self.custom:  # a subclass's save_model is called as upstream calls it, on every rank
            self.trainer.save_model(folder, _internal_call=True)
        elif self.main:  # what save_model(_internal_call=True) does, without gathering the weights again
            self.trainer._save(folder, state_dict=self.weights)

    def load(self, folder: str) -> None:
        self.trainer._load_from_checkpoint(folder)

    def stage(self) -> dict | None:
        """For a background write (`async_writer.StagedPart`): the weights `save` would write, taken
        now (None where this process writes none, or writes only the model's description)."""
        if self.custom:
            raise RuntimeError("a subclass's save_model runs as upstream runs it: save synchronously")
        if not self.main or self.describe_only:
            return None
        return self.weights if self.weights is not None else model_state_dict(self.trainer.model)

    def save_staged(self, folder: str, staged: dict | None, group: Any = None) -> None:
        """`save` from the staged weights, on the writer thread (the same files)."""
        if self.main and self.describe_only:
            write_model(self.trainer, folder, weights=False)
        elif self.main:
            self.trainer._save(folder, state_dict=staged)


class DataState:
    """The "data_state" part: the loop cursor, the sampler's and dataset's state, every process's
    unlogged step losses, and the batch geometry that gives the position its meaning."""

    def __init__(
        self,
        trainer: CheckpointedTrainer,
        dataloader: Any,
        loss_windows: list[list[float]] | None = None,
        folder: str = "",
    ) -> None:
        self.trainer, self.dataloader, self.loss_windows, self.folder = (
            trainer,
            dataloader,
            loss_windows,
            folder,
        )
        self.iterable_restored = False  # an iterable dataset's own state came back (load_state_dict)

    def state_dict(self) -> dict[str, Any]:
        trainer, args, dataloader = self.trainer, self.trainer.args, self.dataloader
        dataset = getattr(dataloader, "dataset", None)
        out: dict[str, Any] = {
            "cursor": trainer.cursor.to_dict(),
            "world_size": trainer.runtime.world_size,
            "dataset_length": len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None,
            "seed": args.data_seed if args.data_seed is not None else args.seed,
            "loss_windows": self.loss_windows,
            **{k: getattr(args, k) for k in POSITION_ARGS},
        }
        sampler: Any = getattr(dataloader, "sampler", None)
        if hasattr(sampler, "state_dict"):
            out["sampler"] = sampler.state_dict()
        if dataset is not None and callable(getattr(dataset, "state_dict", None)):
            out["dataset_state"] = dataset.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The saved position (rescaled to this number of processes), data order and dataset state;
        with ignore_data_skip the current epoch restarts from its first batch."""
        trainer, args, data_state = self.trainer, self.trainer.args, state_dict
        cursor = LoopCursor.from_dict(data_state["cursor"])
        cursor.steps_in_epoch = trainer.cursor.steps_in_epoch
        use_own_loss_window(cursor, data_state, trainer.runtime)
        if args.ignore_data_skip:
            cursor.batch_in_epoch = cursor.samples_in_epoch = 0
        else:
            rescale_position(cursor, data_state, trainer)
        trainer.cursor = cursor
        if not args.ignore_data_skip:
            keep_saved_data_order(trainer, self.dataloader, data_state, self.folder)
        dataset: Any = getattr(self.dataloader, "dataset", None)
        if "dataset_state" in data_state and hasattr(dataset, "load_state_dict"):
            dataset.load_state_dict(data_state["dataset_state"])
            self.iterable_restored = True


class TrainerStateFile:
    """The "trainer_state" part: TrainerState as trainer_state.json (the same JSON as `save_to_json`),
    with the stateful callbacks' state in it."""

    def __init__(self, trainer: CheckpointedTrainer, folder: str = "") -> None:
        self.trainer, self.folder = trainer, folder

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.trainer.state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """What a resume takes of the saved state: counters, history, the best checkpoint (if it still
        exists) and the trial; the callbacks' state goes back into the live callbacks."""
        known = {f.name for f in dataclasses.fields(TrainerState)}
        saved = TrainerState(**{k: v for k, v in state_dict.items() if k in known})
        state = self.trainer.state
        for key in _RESUMED_STATE:
            setattr(state, key, getattr(saved, key))
        best = saved.best_model_checkpoint
        if best is not None and not os.path.isdir(best):
            logger.warning(
                "The best checkpoint recorded in %s (%s) no longer exists; forgetting it.", self.folder, best
            )
            best = None
        state.best_model_checkpoint = best
        _restore_callback_states(self.trainer, saved.stateful_callbacks or {})


# TrainerState fields a resume takes from the checkpoint (the others describe this run's arguments)
_RESUMED_STATE = (
    "global_step",
    "epoch",
    "log_history",
    "best_metric",
    "best_global_step",
    "total_flos",
    "num_input_tokens_seen",
    "stateful_callbacks",
    "trial_name",
    "trial_params",
)


def checkpoint_parts(trainer: CheckpointedTrainer, main: bool) -> dict[str, Any]:
    """The mapping of parts a checkpoint of `trainer` holds now (collectives included: every rank calls it)."""
    args, state, cursor = trainer.args, trainer.state, trainer.cursor
    state.stateful_callbacks = callback_states(trainer)
    windows = trainer.runtime.all_gather_object(trainer._losses.values(cursor.steps_since_log))
    cursor.loss_window = windows[trainer.runtime.rank]
    with_optimizer = not args.save_only_model
    parts: dict[str, Any] = {
        "model": ModelFiles.for_save(trainer, main),
        **_engine(trainer).checkpoint_parts(with_optimizer),
    }
    if with_optimizer:
        parts["scheduler"] = trainer.lr_scheduler
        if trainer.scaler is not None:
            parts["scaler"] = trainer.scaler
        parts["rng"] = RngState()
    parts["data_state"] = DataState(trainer, trainer.callback_handler.train_dataloader, windows)
    parts["trainer_state"] = TrainerStateFile(trainer)
    return parts


def _writes_once(trainer: CheckpointedTrainer) -> bool:
    """Whether this process writes the files a checkpoint holds once (each node's main with save_on_each_node)."""
    args, runtime = trainer.args, trainer.runtime
    return runtime.is_main_process or bool(args.save_on_each_node and runtime.is_local_main_process)


# ---------------------------------------------------------------------- saving
def save(trainer: CheckpointedTrainer, background: Callable[..., bool] | None = None) -> str | None:
    """Write checkpoint-<global_step> atomically, then rotate old ones. With `background` (see
    `async_saves`), `background(manager, folder, name, parts, **rotation)` may take the write over:
    then None is returned and the checkpoint is written in the background."""
    state = trainer.state
    trainer.store_flos()
    folder = run_dir(trainer)
    name = f"{ckpt.PREFIX_CHECKPOINT_DIR}-{state.global_step}"
    if state.best_global_step is not None:
        best = os.path.join(folder, f"{ckpt.PREFIX_CHECKPOINT_DIR}-{state.best_global_step}")
        if state.best_global_step == state.global_step or os.path.isdir(best):
            state.best_model_checkpoint = best
    main = _writes_once(trainer)
    manager, parts = CheckpointManager(trainer.runtime, main=main), checkpoint_parts(trainer, main)
    limit, best_checkpoint = trainer.args.save_total_limit, state.best_model_checkpoint
    if background is not None and background(
        manager, folder, name, parts, save_total_limit=limit, best_checkpoint=best_checkpoint
    ):
        return None
    return manager.save(folder, name, parts, save_total_limit=limit, best_checkpoint=best_checkpoint)


def write_model(
    trainer: CheckpointedTrainer, directory: str, weights: bool = True, state_dict: dict | None = None
) -> None:
    """Weights (or, without them, the model's config), training_args.json and the processing class."""
    config: Any = getattr(trainer.model, "config", None)
    if weights:
        ckpt.save_model_weights(
            trainer.model, directory, max_shard_size=trainer.args.save_max_shard_size, state_dict=state_dict
        )
    elif hasattr(config, "save_pretrained"):
        config.save_pretrained(directory)  # sharded weights: still describe the model
    saved_args = trainer.args.to_dict()
    # how a checkpoint is written, not what it holds: the same bytes either way
    saved_args.pop("async_save", None)
    ckpt.write_json(os.path.join(directory, ckpt.TRAINING_ARGS_NAME), saved_args)
    processing = trainer.processing_class
    if processing is None:
        processing = getattr(trainer.data_collator, "tokenizer", None)
    if processing is not None and hasattr(processing, "save_pretrained"):
        processing.save_pretrained(directory)


def save_model(trainer: CheckpointedTrainer, output_dir: str) -> None:
    """`Trainer.save_model`: weights, processing class and training_args.json (main process).
    A sharded model (FSDP2, DeepSpeed ZeRO-3) is gathered first (every rank must call this)."""
    engine = trainer._engine
    state_dict = engine.full_state_dict(on_every_rank=trainer.args.save_on_each_node) if engine else None
    if trainer.runtime.is_main_process or (
        trainer.args.save_on_each_node and trainer.runtime.is_local_main_process
    ):
        trainer._save(output_dir, state_dict=state_dict)
    trainer.runtime.barrier()


# ---------------------------------------------------------------------- restoring
def restore(trainer: CheckpointedTrainer, path: str, train_dataloader: Any) -> bool:
    """Load everything a checkpoint holds into the Trainer, refusing a resume whose arguments
    change the meaning of the saved position (unless ignore_data_skip). True when an iterable
    dataset's own state came back (its batches are then not skipped again)."""
    args, runtime = trainer.args, trainer.runtime
    manager = CheckpointManager(runtime, main=_writes_once(trainer))
    data_state = manager.read(path, "data_state") if manager.has(path, "data_state") else None
    saved_state = TrainerState.load_from_json(os.path.join(path, ckpt.TRAINER_STATE_NAME))
    if data_state is not None and not args.ignore_data_skip:
        check_position_args(trainer, data_state, train_dataloader, path)

    with_optimizer = not args.save_only_model
    has_scheduler = manager.has(path, "scheduler")
    if _engine(trainer).load(path, optimizer=with_optimizer):  # DCP folders or DeepSpeed's checkpoint
        if has_scheduler and with_optimizer:
            manager.load(path, {"scheduler": trainer.lr_scheduler})
    else:
        manager.load(path, {"model": ModelFiles(trainer)})  # the Trainer's _load_from_checkpoint
        if has_scheduler:
            keep_saved_schedule(trainer, path)
        if manager.has(path, "optimizer") and with_optimizer:
            saved_optimizer = manager.read(path, "optimizer")
            check_optimizer_matches(trainer, saved_optimizer, path)
            optimizer_of(trainer).load_state_dict(saved_optimizer)
        elif manager.has(path, "optimizer"):
            logger.warning("save_only_model=True: resuming the weights of %s with a fresh optimizer.", path)
        if has_scheduler:  # never dropped, even when the optimizer starts afresh
            manager.load(path, {"scheduler": trainer.lr_scheduler})
    if trainer.scaler is not None and manager.has(path, "scaler"):
        manager.load(path, {"scaler": trainer.scaler})

    manager.load(path, {"trainer_state": TrainerStateFile(trainer, path)})
    position = DataState(trainer, train_dataloader, folder=path)
    if data_state is not None:
        position.load_state_dict(data_state)
    else:  # a transformers checkpoint: rebuild the position from global_step, as upstream does
        trainer.cursor = cursor_from_global_step(trainer, saved_state.global_step)
        if args.ignore_data_skip:
            trainer.cursor.batch_in_epoch = trainer.cursor.samples_in_epoch = 0
    cursor = trainer.cursor
    trainer.state.optimizer_step_attempts = cursor.steps_attempted  # data_state.json's, not trainer_state's
    if with_optimizer:
        trainer._load_rng_state(path)
    logger.info(
        "Resumed from %s at step %d (epoch %d, batch %d of it).",
        path,
        cursor.steps_applied,
        cursor.epoch,
        cursor.batch_in_epoch,
    )
    return position.iterable_restored


def load_rng_state(trainer: CheckpointedTrainer, path: str) -> None:
    """`Trainer._load_rng_state`: this process's RNG file of the checkpoint ("rng" part)."""
    CheckpointManager(trainer.runtime, main=_writes_once(trainer)).load(path, {"rng": RngState()})


def load_weights(trainer: CheckpointedTrainer, path: str, model: Any) -> None:
    """A checkpoint's weights into `model`: DCP folders (FSDP) or safetensors / bin files."""
    if fsdp.has_sharded_checkpoint(path):
        fsdp.load_sharded(model, None, path)
    else:
        ckpt.load_model_weights(model, path)


def cleanup_after_training(trainer: CheckpointedTrainer) -> None:
    """With save_total_limit=1, keep only the best checkpoint once training is over (upstream)."""
    args, state = trainer.args, trainer.state
    if (
        args.save_total_limit != 1
        or state.best_model_checkpoint is None
        or not trainer.runtime.is_main_process
    ):
        return
    folder = run_dir(trainer)
    for path in ckpt.sort_checkpoints(folder):
        if os.path.abspath(path) != os.path.abspath(state.best_model_checkpoint):
            logger.info("Deleting %s (save_total_limit=1 keeps the best checkpoint).", path)
            ckpt.delete_checkpoint(path)

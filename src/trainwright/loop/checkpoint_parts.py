"""What a checkpoint of a training run holds: the mapping of parts handed to
`trainwright.checkpoint.manager`, for a save and for a restore.

Each part saves and restores itself, and a part whose restore can refuse a resume checks it in its
own `check(saved, folder)` (the manager runs every check before anything is loaded):

* "model": `ModelFiles` (weights, config, training_args.json, processing class, through the Trainer's
  overridable `_save` / `save_model` / `_load_from_checkpoint`);
* "base_model" (`BaseModelPart`, a PEFT model's: the base its adapters were trained on; refuses
  another);
* the engine's: "optimizer" (`OptimizerPart`: refuses another optimizer's state), or "sharded" (DCP
  folders), or "deepspeed";
* "scheduler" (`SchedulerPart`: the checkpoint's schedule continues), "scaler", "rng" (`RngPart`,
  restored through the Trainer's `_load_rng_state`), "batch_in_hand" (`BatchInHand`: the training
  batch fetched ahead of the next step, where the run can store it; else `RngPart` keeps the RNG
  state it was fetched from);
* "data_state" (`DataState`: the cursor, sampler position and loss windows; refuses a changed batch
  geometry), "trainer_state" (`TrainerStateFile`: TrainerState with the stateful callbacks);
* any callback with a `checkpoint_part` name (a Stateful: `state_dict()` / `load_state_dict()`), e.g.
  an EMA of the weights, stored in the file it declares (`checkpoint_file`), or where a row of
  `layout.PARTS` says.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Protocol

import torch
from torch import nn

import trainwright.checkpoint as ckpt
from trainwright.checkpoint import adapters
from trainwright.checkpoint.layout import declared_spec, spec
from trainwright.checkpoint.rng import LOOK_AHEAD, RngState, saved_look_ahead
from trainwright.checkpoint.weights import model_state_dict
from trainwright.core.events import CallbackHandler
from trainwright.core.modules import is_peft_model
from trainwright.core.state import ExportableState, LoopCursor, TrainerControl, TrainerState
from trainwright.data.kinds import fingerprint
from trainwright.data.look_ahead import LookAhead, batch_from_state
from trainwright.loop import resume
from trainwright.loop.loss_log import LossLog
from trainwright.loop.position import Position
from trainwright.loop.run import TrainingRun
from trainwright.loop.run_plan import RunPlan

logger = logging.getLogger(__name__)


class CheckpointedTrainer(Protocol):
    """What checkpoints need of the Trainer (a Protocol, so this module never imports the Trainer)."""

    args: Any
    runtime: Any
    state: TrainerState
    control: TrainerControl
    callback_handler: CallbackHandler
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any
    scaler: Any
    processing_class: Any
    data_collator: Any
    optimizer_cls_and_kwargs: Any
    hp_search_backend: str | None
    _created_scheduler: bool

    def store_flos(self) -> None: ...
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None: ...
    def _push_from_checkpoint(self, checkpoint_folder: str) -> None: ...
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None: ...
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None: ...
    def _load_rng_state(self, checkpoint: str | None) -> None: ...
    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None: ...
    def _overrides(self, name: str) -> bool: ...
    def _get_output_dir(self, trial: Any) -> str: ...
    def _hp_trial_record(self, trial: Any) -> tuple[str, dict[str, Any]]: ...
    def _fire(self, event: str, state: Any = None, extra: dict | None = None) -> None: ...


def build_parts(
    trainer: CheckpointedTrainer, run: TrainingRun, *, main: bool, restore_from: str | None = None
) -> dict[str, Any]:
    """The mapping of parts of a checkpoint of this run: to save now (every rank calls it: the loss
    windows are gathered), or to restore folder `restore_from`."""
    args, engine, position = trainer.args, run.engine, run.position
    with_optimizer = not args.save_only_model
    engine_parts = engine.checkpoint_parts(with_optimizer, restore_from)
    if "optimizer" in engine_parts:
        engine_parts["optimizer"] = OptimizerPart(trainer, engine_parts["optimizer"])
    # every process's unlogged losses (the callbacks' state is the checkpointer's to put in first)
    windows = run.losses.gather(trainer.state.global_step) if restore_from is None else None
    parts: dict[str, Any] = {"model": ModelFiles(trainer, run, main, restore_from, engine_parts)}
    if is_peft_model(trainer.model):
        parts["base_model"] = BaseModelPart(trainer)
    parts.update(engine_parts)
    data_state = DataState(args, position, run.losses, run.plan, trainer.state, windows)
    if with_optimizer or restore_from is not None:  # a scheduler.pt is restored even without the optimizer
        parts["scheduler"] = SchedulerPart(trainer, run, data_state)
    if with_optimizer:
        if trainer.scaler is not None:
            parts["scaler"] = trainer.scaler
        parts["rng"] = RngPart(trainer, run, data_state)
        ahead = position.look_ahead
        if restore_from is not None or (ahead.holds() and not ahead.captures):
            parts["batch_in_hand"] = BatchInHand(ahead, data_state)
    parts["data_state"] = data_state
    parts["trainer_state"] = TrainerStateFile(trainer)
    for cb in trainer.callback_handler.callbacks:  # callbacks that are checkpoint parts of their own
        name = getattr(cb, "checkpoint_part", None)
        if name is not None:
            declared_spec(name, cb) or spec(name)  # its own checkpoint_file, else a row of layout.PARTS
            parts[name] = cb
    return parts


# ---------------------------------------------------------------------- the model
class ModelFiles:
    """The "model" part: weights (or, where the engine holds them in its own format, the model's
    config only), training_args.json and the processing class, through the Trainer's overridable
    `_save` / `save_model` so that a subclass's override writes them; restored through
    `_load_from_checkpoint` unless the engine's part restores the weights."""

    def __init__(
        self,
        trainer: CheckpointedTrainer,
        run: TrainingRun,
        main: bool,
        restore_from: str | None,
        engine_parts: dict[str, Any],
    ) -> None:
        self.trainer, self.main = trainer, main
        engine = run.engine
        # FSDP2: the DCP folders hold the weights; restoring DCP or DeepSpeed's checkpoint loads them
        self.describe_only = engine.weights_in_own_format or any(
            getattr(p, "holds_weights", False) for p in engine_parts.values()
        )
        self.custom = trainer._overrides("save_model")
        self.weights: dict | None = None
        if restore_from is None and not (self.custom or self.describe_only):
            self.weights = engine.full_state_dict()  # DeepSpeed ZeRO-3 gathers now, on every rank

    def save(self, folder: str) -> None:
        if self.main and self.describe_only:
            write_model(self.trainer, folder, weights=False)
        elif self.custom:  # a subclass's save_model is called as upstream calls it, on every rank
            self.trainer.save_model(folder, _internal_call=True)
        elif self.main:  # what save_model(_internal_call=True) does, without gathering the weights again
            self.trainer._save(folder, state_dict=self.weights)

    def check(self, saved: Any, folder: str) -> None:
        """A PEFT model resumes from an adapter: a folder without one is refused before anything loads."""
        if not self.describe_only and is_peft_model(self.trainer.model):
            adapters.require_adapter(folder)

    def load(self, folder: str) -> None:
        if not self.describe_only:
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


class BaseModelPart:
    """The "base_model" part of a PEFT model's checkpoint (`base_model.json`): the name and the
    fingerprint (`adapters.base_fingerprint`) of the base model its adapters were trained on. Nothing
    is restored from it: its check refuses a resume onto another base (`resume.check_base_model`)."""

    def __init__(self, trainer: CheckpointedTrainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        model = self.trainer.model
        return {
            "base_model_name_or_path": adapters.base_model_name(model),
            "fingerprint": adapters.base_fingerprint(model),
        }

    def check(self, saved: dict[str, Any] | None, folder: str) -> None:
        resume.check_base_model(self.trainer.model, saved, folder)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore: the base model is this run's own, checked to be the checkpoint's."""


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
    ckpt.write_training_args(directory, saved_args)  # .json, and upstream's .bin (a plain dict)
    processing = trainer.processing_class
    if processing is None:
        processing = getattr(trainer.data_collator, "tokenizer", None)
    if processing is not None and hasattr(processing, "save_pretrained"):
        processing.save_pretrained(directory)


# ---------------------------------------------------------------------- optimizer, schedule, RNG
class OptimizerPart:
    """The torch optimizer, refusing state written by another optimizer before anything loads."""

    def __init__(self, trainer: CheckpointedTrainer, optimizer: torch.optim.Optimizer) -> None:
        self.trainer, self.optimizer = trainer, optimizer

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def check(self, saved: dict[str, Any] | None, folder: str) -> None:
        if saved is not None:
            custom = self.trainer.optimizer_cls_and_kwargs is not None
            resume.check_optimizer_matches(self.trainer.args, self.optimizer, saved, folder, custom)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(resume.align_empty_groups(state_dict, self.optimizer))


class SchedulerPart:
    """The Trainer's learning-rate scheduler; on restore the checkpoint's schedule continues: a
    Trainer-made scheduler is rebuilt from the checkpoint's schedule arguments, over this run's
    steps, or over the steps the data state's check re-sized them to (a resume in another batch
    geometry), keeping the rates the optimizer holds."""

    def __init__(self, trainer: CheckpointedTrainer, run: TrainingRun, data_state: DataState) -> None:
        self.trainer, self.run, self.data_state = trainer, run, data_state
        self.folder = ""

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.lr_scheduler.state_dict()

    def check(self, saved: dict[str, Any] | None, folder: str) -> None:
        self.folder = folder

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        trainer, optimizer = self.trainer, self.trainer.optimizer
        if optimizer is not None:
            rates = [group["lr"] for group in optimizer.param_groups]  # the checkpoint's, loaded before
            scheduler = resume.keep_saved_schedule(
                trainer.args,
                trainer.lr_scheduler,
                optimizer,
                self.data_state.max_steps,  # the data state's check re-sized it where the geometry changed
                self.folder,
                trainer._created_scheduler,
                resized=self.data_state.resized_to is not None,
            )
            if scheduler is not trainer.lr_scheduler:  # a new scheduler sets the rates of its step 0
                trainer.lr_scheduler = scheduler
                for group, rate in zip(optimizer.param_groups, rates):
                    group["lr"] = rate
        trainer.lr_scheduler.load_state_dict(state_dict)


class RngPart(RngState):
    """This process's random generators; restored through the Trainer's `_load_rng_state` hook. Where
    the run's batch in hand cannot be stored (`BatchInHand`), also the state from before it was
    fetched (`LOOK_AHEAD`), which the resumed epoch fetches it again from."""

    def __init__(self, trainer: CheckpointedTrainer, run: TrainingRun, data_state: DataState) -> None:
        self.trainer, self.run, self.data_state = trainer, run, data_state

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        ahead = self.run.position.look_ahead
        if ahead.captures and ahead.holds() and ahead.fetched_from is not None:
            state[LOOK_AHEAD] = ahead.fetched_from
        return state

    def load(self, folder: str) -> None:
        self.trainer._load_rng_state(folder)
        runtime = self.trainer.runtime
        fetched_from = saved_look_ahead(folder, runtime.rank, runtime.world_size)
        if fetched_from is not None and self.data_state.keeps_batch_in_hand:
            self.run.position.look_ahead.resume_with(rng=fetched_from)


class BatchInHand:
    """The training batch fetched ahead of the next step (`data/look_ahead.py`), this process's,
    weights-only: the resumed epoch yields it first. Kept only where the resume keeps the saved
    position in the same batches (not with `ignore_data_skip`, another batch size or processes)."""

    def __init__(self, look_ahead: LookAhead, data_state: DataState) -> None:
        self.look_ahead, self.data_state = look_ahead, data_state

    def state_dict(self) -> dict[str, Any]:
        return self.look_ahead.stored_in_hand()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.data_state.keeps_batch_in_hand:
            self.look_ahead.resume_with(batch_from_state(state_dict))


# ---------------------------------------------------------------------- position and state
@dataclasses.dataclass(frozen=True)
class PositionFinding:
    """What the data state's check found: the steps a run sized by epochs has in another batch
    geometry (`resized_to`: the checkpointer gives the run a plan of that many), and the position of
    a checkpoint without data_state.json (`absent`, from its global_step or epoch)."""

    resized_to: int | None = None
    absent: LoopCursor | None = None


class DataState:
    """The "data_state" part: the run's position (`Position`: the loop cursor, the sampler's and
    dataset's state, the batch geometry that gives it its meaning) and the loss log's part of it
    (every process's unlogged step losses, the divergence note). Built from those values; its check
    returns what it found (`PositionFinding`) and writes nothing of the run."""

    def __init__(
        self,
        args: Any,
        position: Position,
        losses: LossLog,
        plan: RunPlan,
        state: TrainerState,
        loss_windows: list[list[float | None]] | None = None,
    ) -> None:
        self.args, self.position, self.losses, self.plan, self.state = args, position, losses, plan, state
        self.loss_windows = loss_windows
        self.world_size = plan.data_world_size  # the position is per data-parallel rank
        self.folder = ""
        # the resume continues the saved position in the same batches: a batch in hand is the next one
        self.keeps_batch_in_hand = False
        self.found = PositionFinding()  # the last check's

    @property
    def resized_to(self) -> int | None:
        return self.found.resized_to

    @property
    def max_steps(self) -> int:
        """The run's steps, or those the check found for another batch geometry (the schedule's)."""
        return self.plan.max_steps if self.found.resized_to is None else self.found.resized_to

    def state_dict(self) -> dict[str, Any]:
        args, position = self.args, self.position
        dataset = getattr(position.dataloader, "dataset", None)
        out: dict[str, Any] = {
            "cursor": position.cursor.to_dict(),
            "world_size": self.world_size,  # of the position: data-parallel ranks
            "dataset_length": len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None,
            "dataset_fingerprint": fingerprint(dataset),  # a `datasets` dataset's: other rows, another one
            "seed": args.data_seed if args.data_seed is not None else args.seed,
            "loss_windows": self.loss_windows,
            "evaluation_pending": position.evaluation_pending,
            **self.losses.divergence.state_dict(),
            **{k: getattr(args, k) for k in resume.POSITION_ARGS},
        }
        sampler: Any = getattr(position.dataloader, "sampler", None)
        if hasattr(sampler, "state_dict"):
            out["sampler"] = sampler.state_dict()
        if dataset is not None and callable(getattr(dataset, "state_dict", None)):
            ahead = position.look_ahead  # fetched again at a resume: the dataset's state from before that
            before = ahead.dataset_before if ahead.captures and ahead.holds() else None
            out["dataset_state"] = before if before is not None else dataset.state_dict()
        return out

    def check(self, saved: dict[str, Any] | None, folder: str) -> PositionFinding:
        """Refuse a resume whose saved position can't be mapped onto this run (another dataset
        length); map another batch geometry (one warning), and, for a run sized by epochs, find the
        steps left in the new geometry (the checkpointer re-sizes the run's schedule to them)."""
        self.folder = folder
        self.found = self._find(saved, folder)
        return self.found

    def _find(self, saved: dict[str, Any] | None, folder: str) -> PositionFinding:
        args, position, world_size = self.args, self.position, self.world_size
        if saved is None and not args.ignore_data_skip:
            return self._position_without_data_state(folder)
        if saved is None or args.ignore_data_skip:
            return PositionFinding()
        ckpt.check_data_state(saved, folder, world_size, position.dataloader)  # fields a resume reads
        resume.warn_changed_workers(args, folder)
        changed = resume.check_position_args(args, world_size, saved, position.dataloader, folder)
        if not changed or not resume.say_geometry_change(folder, changed, saved, args, world_size):
            return PositionFinding()
        if args.max_steps <= 0 and position.cursor.steps_in_epoch:
            return PositionFinding(resized_to=self._steps_for(self._position(saved)))
        return PositionFinding()

    def _steps_for(self, cursor: LoopCursor) -> int:
        """A run sized by epochs, resumed at `cursor` in another geometry: its steps, those left added."""
        return cursor.steps_applied + resume.steps_left(
            cursor,
            self.plan.epochs,
            self.args.gradient_accumulation_steps,
            self._micro_left(cursor),
            self.position.cursor.steps_in_epoch,
        )

    def _position_without_data_state(self, folder: str) -> PositionFinding:
        """A checkpoint without data_state.json (transformers'): the position from its global_step,
        or, where this run's geometry puts that step elsewhere, from its epoch (trainer_state.json),
        with the schedule sized for the steps left."""
        args = self.args
        state = ckpt.read_json(os.path.join(folder, ckpt.TRAINER_STATE_NAME))
        step, epoch = state.get("global_step"), state.get("epoch")
        if not isinstance(step, int) or not isinstance(epoch, (int, float)):
            return PositionFinding()  # the trainer state's own check names what is wrong with it
        cursor = resume.cursor_from_global_step(args, self.position.cursor.steps_in_epoch, step)
        if resume.align_with_saved_epoch(cursor, float(epoch), args, folder) and args.max_steps <= 0:
            return PositionFinding(resized_to=self._steps_for(cursor), absent=cursor)
        return PositionFinding(absent=cursor)

    def _position(self, saved: dict[str, Any]) -> LoopCursor:
        """The saved cursor on this run's geometry."""
        args, position = self.args, self.position
        cursor = LoopCursor.from_dict(saved["cursor"])
        cursor.steps_in_epoch = position.cursor.steps_in_epoch
        loader_batch = getattr(
            position.dataloader, "batch_size", None
        )  # a subclass's loader may batch otherwise
        batch = (
            position.geometry[0] if position.geometry else loader_batch or args.per_device_train_batch_size
        )
        resume.rescale_position(cursor, saved, self.world_size, batch, args.per_device_train_batch_size)
        return cursor

    def _micro_left(self, cursor: LoopCursor) -> int:
        """Micro-batches left in the cursor's epoch (exact where the sampler's geometry is known)."""
        geometry = self.position.geometry
        if geometry is None:
            return max(cursor.steps_in_epoch - cursor.batch_in_epoch, 0)
        batch, samples = geometry
        left = max(samples - cursor.samples_in_epoch, 0)
        return left // batch if self.args.dataloader_drop_last else -(-left // batch)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The saved position (rescaled to this number of processes), data order and dataset state;
        with ignore_data_skip the current epoch restarts from its first batch."""
        args, position, world_size = self.args, self.position, self.world_size
        if args.ignore_data_skip:
            cursor = LoopCursor.from_dict(state_dict["cursor"])
            cursor.steps_in_epoch = position.cursor.steps_in_epoch
            cursor.batch_in_epoch = cursor.samples_in_epoch = 0
        else:
            cursor = self._position(state_dict)
            resume.keep_saved_data_order(args, world_size, position.dataloader, state_dict, self.folder)
            self.keeps_batch_in_hand = state_dict.get("world_size", 1) == world_size and state_dict.get(
                "per_device_train_batch_size"
            ) == getattr(args, "per_device_train_batch_size", None)
        resume.use_own_loss_window(cursor, state_dict, self.losses.runtime)
        self.losses.divergence.load_state_dict(state_dict)
        dataset: Any = getattr(position.dataloader, "dataset", None)
        restored = "dataset_state" in state_dict and hasattr(dataset, "load_state_dict")
        if restored:
            dataset.load_state_dict(state_dict["dataset_state"])
        position.resume_at(cursor, bool(state_dict.get("evaluation_pending")), iterable_restored=restored)

    def load_absent(self, folder: str) -> None:
        """A transformers checkpoint: the position rebuilt from global_step, as upstream does (from its
        epoch where this run's geometry differs: `check`)."""
        args = self.args
        cursor = self.found.absent or resume.cursor_from_global_step(
            args, self.position.cursor.steps_in_epoch, self.state.global_step
        )
        if args.ignore_data_skip:
            cursor.batch_in_epoch = cursor.samples_in_epoch = 0
        self.position.resume_at(cursor, evaluation_pending=False)


class TrainerStateFile:
    """The "trainer_state" part: TrainerState as trainer_state.json (the same JSON as `save_to_json`),
    with the stateful callbacks' state in it."""

    def __init__(self, trainer: CheckpointedTrainer) -> None:
        self.trainer = trainer
        self.folder = ""

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.trainer.state)

    def check(self, saved: dict[str, Any] | None, folder: str) -> None:
        self.folder = folder  # named in the warning about a best checkpoint that is gone
        if saved is not None:
            resume.check_saved_step(saved, folder)

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
        restore_callback_states(self.trainer, saved.stateful_callbacks or {})


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


# ---------------------------------------------------------------------- callbacks' state
def callback_states(handler: CallbackHandler, control: TrainerControl) -> dict[str, Any]:
    """{ClassName: {"args", "attributes"}} of callbacks that export state, plus TrainerControl."""
    states: dict[str, Any] = {}
    for cb in [*handler.callbacks, control]:
        if not isinstance(cb, ExportableState) or not callable(getattr(cb, "state", None)):
            continue
        name = type(cb).__name__
        if name in states:
            existing = states[name]
            states[name] = [*(existing if isinstance(existing, list) else [existing]), cb.state()]
        else:
            states[name] = cb.state()
    return states


def restore_callback_states(trainer: CheckpointedTrainer, saved: dict[str, Any]) -> None:
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

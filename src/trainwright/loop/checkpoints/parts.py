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
import functools
import logging
import os
from collections.abc import Callable
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
from trainwright.core.state import TrainerControl, TrainerState
from trainwright.data.look_ahead import LookAhead
from trainwright.loop.checkpoints import resume
from trainwright.loop.checkpoints.callback_states import restore_callback_states
from trainwright.loop.checkpoints.data_state import BatchInHand, DataState
from trainwright.loop.run.training_run import TrainingRun

logger = logging.getLogger(__name__)


class CheckpointedTrainer(Protocol):
    """The Trainer as `build_parts` (and the checkpointer) receive it at the call (a Protocol, so this
    module never imports the Trainer): the values the parts are built from, and the upstream hooks a
    subclass may override, handed to the parts as bound methods. The parts never hold the Trainer."""

    args: Any
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
    _created_lr_scheduler: bool

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None: ...
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None: ...
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None: ...
    def _load_rng_state(self, checkpoint: str | None) -> None: ...

    # and the upstream hooks loop/checkpoints/checkpointer.py calls
    def store_flos(self) -> None: ...
    def _push_from_checkpoint(self, checkpoint_folder: str) -> None: ...
    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None: ...


def build_parts(
    trainer: CheckpointedTrainer,
    run: TrainingRun,
    runtime: Any,
    *,
    main: bool,
    restore_from: str | None = None,
    overridden: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The mapping of parts of a checkpoint of this run: to save now (every rank calls it: the loss
    windows are gathered), or to restore folder `restore_from`. The one place the Trainer hands its
    values in: each part is built from what it reads (`overridden`: the upstream hooks the Trainer's
    subclass overrides, as the Trainer told the checkpointer)."""
    args, engine, model, position = trainer.args, run.engine, trainer.model, run.position
    with_optimizer = not args.save_only_model
    engine_parts = engine.checkpoint_parts(with_optimizer, restore_from)
    if "optimizer" in engine_parts:
        custom = trainer.optimizer_cls_and_kwargs is not None
        engine_parts["optimizer"] = OptimizerPart(args, engine_parts["optimizer"], custom)
    # every process's unlogged losses (the callbacks' state is the checkpointer's to put in first)
    windows = run.losses.gather(trainer.state.global_step) if restore_from is None else None
    hooks = ModelHooks(  # bound: a subclass's override is what runs
        save=trainer._save,
        load=trainer._load_from_checkpoint,
        save_model=trainer.save_model if "save_model" in overridden else None,
    )
    describe = functools.partial(
        write_model,
        model=model,
        args=args,
        processing_class=trainer.processing_class,
        data_collator=trainer.data_collator,
        weights=False,
    )  # the config, arguments and processing class, where the engine's parts hold the weights
    parts: dict[str, Any] = {
        "model": model_files(model, describe, hooks, engine, main, restore_from, engine_parts)
    }
    if is_peft_model(model):
        parts["base_model"] = BaseModelPart(model)
    parts.update(engine_parts)
    data_state = DataState(args, position, run.losses, run.plan, trainer.state, windows)
    if with_optimizer or restore_from is not None:  # a scheduler.pt is restored even without the optimizer

        def replace(scheduler: Any) -> None:  # a rebuilt schedule becomes the Trainer's
            trainer.lr_scheduler = scheduler

        parts["scheduler"] = SchedulerPart(
            args,
            trainer.lr_scheduler,
            trainer.optimizer,
            trainer._created_lr_scheduler,
            replace,
            data_state,
        )
    if with_optimizer:
        if trainer.scaler is not None:
            parts["scaler"] = trainer.scaler
        parts["rng"] = RngPart(trainer._load_rng_state, runtime, position.look_ahead, data_state)
        ahead = position.look_ahead
        if restore_from is not None or (ahead.holds() and not ahead.captures):
            parts["batch_in_hand"] = BatchInHand(ahead, data_state)
    parts["data_state"] = data_state
    parts["trainer_state"] = TrainerStateFile(trainer.state, trainer.callback_handler, trainer.control, args)
    for cb in trainer.callback_handler.callbacks:  # callbacks that are checkpoint parts of their own
        name = getattr(cb, "checkpoint_part", None)
        if name is not None:
            declared_spec(name, cb) or spec(name)  # its own checkpoint_file, else a row of layout.PARTS
            parts[name] = cb
    return parts


# ---------------------------------------------------------------------- the model
@dataclasses.dataclass(frozen=True)
class ModelHooks:
    """The Trainer's model hooks, bound: `_save`, `_load_from_checkpoint`, and `save_model` where a
    subclass overrides it (a checkpoint then calls it as upstream does)."""

    save: Callable[..., None]
    load: Callable[[str], None]
    save_model: Callable[..., None] | None = None


class ModelFiles:
    """The "model" part: weights (or, where the engine holds them in its own format, the model's
    config only), training_args.json and the processing class, through the Trainer's overridable
    `_save` / `save_model` so that a subclass's override writes them; restored through
    `_load_from_checkpoint` unless the engine's part restores the weights."""

    def __init__(
        self,
        model: nn.Module,
        describe: Callable[[str], None],
        hooks: ModelHooks,
        main: bool,
        describe_only: bool,
        weights: dict | None = None,
    ) -> None:
        self.model, self.describe, self.hooks, self.main = model, describe, hooks, main
        # FSDP2: the DCP folders hold the weights; restoring DCP or DeepSpeed's checkpoint loads them
        self.describe_only = describe_only
        self.custom = hooks.save_model is not None
        self.weights = weights

    def save(self, folder: str) -> None:
        if self.main and self.describe_only:
            self.describe(folder)
        elif (
            self.hooks.save_model is not None
        ):  # a subclass's save_model, called as upstream calls it, on every rank
            self.hooks.save_model(folder, _internal_call=True)
        elif self.main:  # what save_model(_internal_call=True) does, without gathering the weights again
            self.hooks.save(folder, state_dict=self.weights)

    def check(self, saved: Any, folder: str) -> None:
        """A PEFT model resumes from an adapter: a folder without one is refused before anything loads."""
        if not self.describe_only and is_peft_model(self.model):
            adapters.require_adapter(folder)

    def load(self, folder: str) -> None:
        if not self.describe_only:
            self.hooks.load(folder)

    def stage(self) -> dict | None:
        """For a background write (`async_writer.StagedPart`): the weights `save` would write, taken
        now (None where this process writes none, or writes only the model's description)."""
        if self.custom:
            raise RuntimeError("a subclass's save_model runs as upstream runs it: save synchronously")
        if not self.main or self.describe_only:
            return None
        return self.weights if self.weights is not None else model_state_dict(self.model)

    def save_staged(self, folder: str, staged: dict | None, group: Any = None) -> None:
        """`save` from the staged weights, on the writer thread (the same files)."""
        if self.main and self.describe_only:
            self.describe(folder)
        elif self.main:
            self.hooks.save(folder, state_dict=staged)


def model_files(
    model: nn.Module,
    describe: Callable[[str], None],
    hooks: ModelHooks,
    engine: Any,
    main: bool,
    restore_from: str | None,
    engine_parts: dict[str, Any],
) -> ModelFiles:
    """The "model" part beside the engine's (only the description where those hold the weights); a
    save's weights gathered now, on every rank (ZeRO-3)."""
    describe_only = engine.weights_in_own_format or any(
        getattr(p, "holds_weights", False) for p in engine_parts.values()
    )
    weights = None
    if restore_from is None and not (hooks.save_model is not None or describe_only):
        weights = engine.full_state_dict()
    return ModelFiles(model, describe, hooks, main, describe_only, weights)


class BaseModelPart:
    """The "base_model" part of a PEFT model's checkpoint (`base_model.json`): the name and the
    fingerprint (`adapters.base_fingerprint`) of the base model its adapters were trained on. Nothing
    is restored from it: its check refuses a resume onto another base (`resume.check_base_model`)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return {
            "base_model_name_or_path": adapters.base_model_name(self.model),
            "fingerprint": adapters.base_fingerprint(self.model),
        }

    def check(self, saved: dict[str, Any] | None, folder: str) -> None:
        resume.check_base_model(self.model, saved, folder)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # nothing to restore: it was checked
        pass


def write_model(
    directory: str,
    model: nn.Module,
    args: Any,
    processing_class: Any = None,
    data_collator: Any = None,
    weights: bool = True,
    state_dict: dict | None = None,
) -> None:
    """Weights (or, without them, the model's config), training_args.json and the processing class
    (else the collator's tokenizer)."""
    config: Any = getattr(model, "config", None)
    if weights:
        ckpt.save_model_weights(
            model, directory, max_shard_size=args.save_max_shard_size, state_dict=state_dict
        )
    elif hasattr(config, "save_pretrained"):
        config.save_pretrained(directory)  # sharded weights: still describe the model
    saved_args = args.to_dict()
    # how a checkpoint is written, not what it holds: the same bytes either way
    saved_args.pop("async_save", None)
    ckpt.write_training_args(directory, saved_args)  # .json, and upstream's .bin (a plain dict)
    processing = processing_class
    if processing is None:
        processing = getattr(data_collator, "tokenizer", None)
    if processing is not None and hasattr(processing, "save_pretrained"):
        processing.save_pretrained(directory)


# ---------------------------------------------------------------------- optimizer, schedule, RNG
class OptimizerPart:
    """The torch optimizer, refusing state written by another optimizer before anything loads
    (`custom`: the Trainer was given `optimizer_cls_and_kwargs`)."""

    def __init__(self, args: Any, optimizer: torch.optim.Optimizer, custom: bool) -> None:
        self.args, self.optimizer, self.custom = args, optimizer, custom

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def check(self, saved: dict[str, Any] | None, folder: str) -> None:
        if saved is not None:
            resume.check_optimizer_matches(self.args, self.optimizer, saved, folder, self.custom)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(resume.align_empty_groups(state_dict, self.optimizer))


class SchedulerPart:
    """The Trainer's learning-rate scheduler; on restore the checkpoint's schedule continues: a
    Trainer-made scheduler is rebuilt from the checkpoint's schedule arguments, over this run's
    steps, or over the steps the data state's check re-sized them to (a resume in another batch
    geometry), keeping the rates the optimizer holds; `replace` hands the rebuilt one to its owner."""

    def __init__(
        self,
        args: Any,
        scheduler: Any,
        optimizer: torch.optim.Optimizer | None,
        trainer_made: bool,
        replace: Callable[[Any], None],
        data_state: DataState,
    ) -> None:
        self.args, self.scheduler, self.optimizer = args, scheduler, optimizer
        self.trainer_made, self.replace = trainer_made, replace
        self.data_state = data_state
        self.folder = ""

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def check(self, saved: dict[str, Any] | None, folder: str) -> None:
        self.folder = folder

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        optimizer = self.optimizer
        if optimizer is not None:
            rates = [group["lr"] for group in optimizer.param_groups]  # the checkpoint's, loaded before
            scheduler = resume.keep_saved_schedule(
                self.args,
                self.scheduler,
                optimizer,
                self.data_state.max_steps,  # the data state's check re-sized it where the geometry changed
                self.folder,
                self.trainer_made,
                resized=self.data_state.resized_to is not None,
            )
            if scheduler is not self.scheduler:  # a new scheduler sets the rates of its step 0
                self.scheduler = scheduler
                self.replace(scheduler)
                for group, rate in zip(optimizer.param_groups, rates):
                    group["lr"] = rate
        self.scheduler.load_state_dict(state_dict)


class RngPart(RngState):
    """This process's random generators; restored through the Trainer's `_load_rng_state` hook
    (`load_rng_state`, bound). Where the run's batch in hand cannot be stored (`BatchInHand`), also the
    state from before it was fetched (`LOOK_AHEAD`), which the resumed epoch fetches it again from."""

    def __init__(
        self,
        load_rng_state: Callable[[str | None], None],
        runtime: Any,
        look_ahead: LookAhead,
        data_state: DataState,
    ) -> None:
        self.load_rng_state, self.runtime = load_rng_state, runtime
        self.look_ahead, self.data_state = look_ahead, data_state

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        ahead = self.look_ahead
        if ahead.captures and ahead.holds() and ahead.fetched_from is not None:
            state[LOOK_AHEAD] = ahead.fetched_from
        return state

    def load(self, folder: str) -> None:
        self.load_rng_state(folder)
        fetched_from = saved_look_ahead(folder, self.runtime.rank, self.runtime.world_size)
        if fetched_from is not None and self.data_state.keeps_batch_in_hand:
            self.look_ahead.resume_with(rng=fetched_from)


class TrainerStateFile:
    """The "trainer_state" part: TrainerState as trainer_state.json (the same JSON as `save_to_json`),
    with the stateful callbacks' state in it, restored into the live callbacks."""

    def __init__(
        self, state: TrainerState, handler: CallbackHandler, control: TrainerControl, args: Any
    ) -> None:
        self.state, self.handler, self.control, self.args = state, handler, control, args
        self.folder = ""

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.state)

    def check(self, saved: dict[str, Any] | None, folder: str) -> None:
        self.folder = folder  # named in the warning about a best checkpoint that is gone
        if saved is not None:
            resume.check_saved_step(saved, folder)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """What a resume takes of the saved state: counters, history, the best checkpoint (if it still
        exists) and the trial; the callbacks' state goes back into the live callbacks."""
        known = {f.name for f in dataclasses.fields(TrainerState)}
        saved = TrainerState(**{k: v for k, v in state_dict.items() if k in known})
        state = self.state
        for key in _RESUMED_STATE:
            setattr(state, key, getattr(saved, key))
        best = saved.best_model_checkpoint
        if best is not None and not os.path.isdir(best):
            logger.warning(
                "The best checkpoint recorded in %s (%s) no longer exists; forgetting it.", self.folder, best
            )
            best = None
        state.best_model_checkpoint = best
        full = self.args.restore_callback_states_from_checkpoint
        restore_callback_states(self.handler, self.control, saved.stateful_callbacks or {}, full)


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

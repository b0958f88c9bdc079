"""`Checkpointer`: a run's checkpoints, as torchtitan's CheckpointManager: it writes them (synchronously,
or with `async_save` in the background), finishes a background write (rotation, the Hub push,
`on_save` once it is durable), waits for it or abandons it, and restores a folder into the run,
through the same mapping of parts it saves (`parts.build_parts`).

When to save is the callback system's (`TrainerControl.should_save`, as upstream): the Trainer's
`_save_checkpoint` calls `save`, then `saved` fires `on_save` (or leaves it to the write's completion).

Background writes (`async_save=True`): at a save step the checkpoint's mapping of parts is copied
into reused host memory and written by `AsyncCheckpointWriter`'s thread into the same hidden folder,
with the same fsyncs, manifest and rename as a synchronous save. Then:

* `poll` at the end of every step: once the write is durable on every process, the completion work
  runs in the training thread: rotation, the Hub push of the checkpoint, and `on_save`, which
  therefore marks the moment the checkpoint is complete on disk; it receives the TrainerState of the
  saved step (its `global_step` names the folder) and the live `TrainerControl`;
* `wait` before anything that needs the checkpoint on disk or the writer idle: the next save,
  `save_model`, loading the best model, the end of `train()` (a preemption's exit included);
* `abandon` when `train()` is leaving on an exception: the write in flight finishes (a complete
  checkpoint, or none) without the completion work, and its error is noted on the exception; on a
  KeyboardInterrupt (a second Ctrl-C: "aborting without a checkpoint") it is cancelled instead, and
  is not committed unless it was already committing.

A save the snapshot can't serve is written synchronously (the reason is logged once): a subclass that
overrides `_save_checkpoint`, `_save` or `save_model` (called as upstream calls it, in the training
thread), and engines whose parts can't be staged (DeepSpeed's engine checkpoint). Several processes:
the writer threads commit through a gloo group of their own, created at the first background save
(which every process reaches at the same step), and a write is finished at the same step everywhere
(one CPU all-reduce per step while it is pending).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import trainwright.checkpoint as ckpt
from trainwright.checkpoint.async_writer import AsyncCheckpointWriter, GroupCollectives, save_checkpoint_async
from trainwright.checkpoint.manager import CheckpointManager
from trainwright.checkpoint.rng import RngState
from trainwright.core.state import TrainerControl
from trainwright.loop.checkpoints.callback_states import callback_states
from trainwright.loop.checkpoints.parts import CheckpointedTrainer, build_parts
from trainwright.loop.run.divergence import Divergence

if TYPE_CHECKING:
    from trainwright.loop.run.training_run import TrainingRun

logger = logging.getLogger(__name__)

# Upstream hooks that, when a subclass overrides them, must run as upstream runs them (in the
# training thread, on the live model): their saves are synchronous.
_HOOKS = ("_save_checkpoint", "_save", "save_model")
# every hook whose override changes what the checkpointer does (the Trainer says which it overrides)
OVERRIDABLE = (*_HOOKS, "_load_optimizer_and_scheduler")
# the Trainer's event dispatch, handed in at the calls that send an event: (event, state=None)
Fire = Callable[..., None]
# the parts upstream's `_load_optimizer_and_scheduler` loads
OPTIMIZER_PARTS = ("optimizer", "scheduler")


def run_dir(output_dir: str | None, trial_name: str | None) -> str:
    """Where a run's checkpoints go: output_dir, or a search trial's own folder in it."""
    assert output_dir is not None  # TrainingArguments.__post_init__ fills it in
    return output_dir if trial_name is None else os.path.join(output_dir, trial_name)


def _step_of(path: str) -> int:
    tail = os.path.basename(path.rstrip(os.sep)).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def writes_once(args: Any, runtime: Any) -> bool:
    """Whether this process writes the files a checkpoint holds once (each node's main with save_on_each_node)."""
    return runtime.is_main_process or bool(args.save_on_each_node and runtime.is_local_main_process)


class Checkpointer:
    """The checkpoints of one run (see the module docstring)."""

    def __init__(
        self,
        args: Any,
        runtime: Any,
        folder: str,
        resume_from: str | None = None,
        overridden: frozenset[str] = frozenset(),
    ) -> None:
        # built from values: the Trainer and the run are handed in at the calls that need them (an
        # upstream hook, the parts of a checkpoint) and never stored, so no cycle runs through this
        self.args, self.runtime, self.folder = args, runtime, folder
        # the upstream hooks (OVERRIDABLE) a Trainer subclass overrides: run as upstream runs them
        self.overridden = overridden
        self.main = writes_once(args, runtime)
        self.manager = CheckpointManager(runtime, main=self.main)
        # checkpoints in the folder that are not this run's: never rotated away
        self.foreign = self._foreign(resume_from) if self.main else []
        self.writer: AsyncCheckpointWriter | None = None  # made at the first background save
        # at each step end: finish a background write that is durable (only async_save writes one)
        self.poll: Callable[[], None] = self._poll_writer if args.async_save else _nothing
        self._collectives: GroupCollectives | None = None  # its process group, with several processes
        self._said: set[str] = set()
        self._last_step: int | None = None  # the step of this run's last checkpoint
        self._deferred: dict[str, Any] | None = None  # the parts a resume leaves to a subclass's hook

    def wrote(self, step: int) -> bool:
        """Whether this run already wrote the checkpoint of `step`."""
        return self._last_step == step

    def _foreign(self, resume_from: str | None) -> list[str]:
        """Checkpoints in the run's folder this run does not continue: all of them for a fresh run,
        those after the resumed step for a resume (another run's, or this run's before the resume).
        Said once; they are kept, and a checkpoint this run writes at the same step replaces one."""
        if not os.path.isdir(self.folder):
            return []
        existing = ckpt.sort_checkpoints(self.folder)
        resumed = os.path.abspath(resume_from) if resume_from is not None else None
        if resumed is not None and os.path.dirname(resumed) == os.path.abspath(self.folder):
            after = [p for p in existing if _step_of(p) > _step_of(resumed)]
        else:
            after = existing
        if after:
            self._say_foreign(after)
        return after

    def _say_foreign(self, after: list[str]) -> None:
        """The start-of-run warning about checkpoints this run does not continue; it advises resuming
        only a complete one (a damaged one is what a resume just fell back from)."""
        complete = [p for p in after if not ckpt.verify_checkpoint(p, checksums=False)]
        damaged = len(after) - len(complete)
        advice = (
            f"resume that run with resume_from_checkpoint={complete[-1]!r} instead, or train into another "
            "output_dir"
            if complete
            else "none of them is complete, so no resume can take them; train into another output_dir "
            "to keep them apart"
        )
        logger.warning(
            "%s holds %d checkpoint(s) this run does not continue (newest: %s%s). They are kept and not "
            "counted by save_total_limit, but get_last_checkpoint() and resume_from_checkpoint=True pick "
            "the highest complete step: %s.",
            self.folder,
            len(after),
            os.path.basename(after[-1]),
            f"; {damaged} damaged" if damaged else "",
            advice,
        )

    # -- saving --------------------------------------------------------------------------------
    def save(self, trainer: CheckpointedTrainer, run: TrainingRun, fire: Fire) -> str | None:
        """Write checkpoint-<global_step> of `run` and rotate: the path, or None when it is being
        written in the background (its completion work runs once it is durable: `fire`, the
        Trainer's event dispatch handed in at the call, sends its `on_save`)."""
        self.wait()  # the previous background write first, as after a synchronous save
        state = trainer.state
        trainer.store_flos()
        name = f"{ckpt.PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if state.best_global_step is not None:
            best = os.path.join(self.folder, f"{ckpt.PREFIX_CHECKPOINT_DIR}-{state.best_global_step}")
            if state.best_global_step == state.global_step or os.path.isdir(best):
                state.best_model_checkpoint = best
        # the callbacks' state goes into trainer_state.json (every process gathers the loss windows)
        state.stateful_callbacks = callback_states(trainer.callback_handler, trainer.control)
        parts = build_parts(
            trainer, run, self.runtime, overridden=self.overridden, main=self.main
        )  # notes a non-finite window
        self._last_step = state.global_step
        path, divergence = os.path.join(self.folder, name), run.losses.divergence
        self.foreign = [p for p in self.foreign if os.path.abspath(p) != os.path.abspath(path)]
        divergence.checkpoint_written(path)  # recorded in this checkpoint's data_state.json too
        rotation = {
            "save_total_limit": self.args.save_total_limit,
            "best_checkpoint": state.best_model_checkpoint,
            # after a divergence the newest checkpoint written before it is kept, as the best one is
            "keep": divergence.kept(),
            "exclude": list(self.foreign),
        }
        if self.args.async_save and self._in_background(
            [hook for hook in _HOOKS if hook in self.overridden],
            name,
            parts,
            rotation,
            # the write in flight holds the Trainer until it is finished (no longer: the writer drops it)
            partial(
                _durable, trainer, fire, saved_state=copy.copy(state)
            ),  # on_save: the saved step's counters
        ):
            return None
        return self.manager.save(self.folder, name, parts, **rotation)

    def _in_background(
        self,
        overridden: list[str],
        name: str,
        parts: dict[str, Any],
        rotation: dict[str, Any],
        on_done: Callable[[str], None],
    ) -> bool:
        if overridden:
            self._say(f"the Trainer subclass overrides {', '.join(overridden)}")
            return False
        writer = self._writer()
        if save_checkpoint_async(
            writer,
            self.manager,
            self.folder,
            name,
            parts,
            collectives=self._collectives,
            on_done=on_done,
            **rotation,
        ):
            return True
        self._say("a checkpoint part can't be staged (DeepSpeed's engine checkpoint)")
        return False

    def saved(self, control: TrainerControl, fire: Fire) -> None:
        """After `_save_checkpoint` in the loop: `on_save` now (through `fire`, the Trainer's event
        dispatch), or, for a write still in the background, once it is durable (`should_save` is
        cleared now, as `on_save` would)."""
        if self.writer is not None and self.writer.pending:
            control.should_save = False
        else:
            fire("on_save")

    def _writer(self) -> AsyncCheckpointWriter:
        if self.writer is None:
            if self.runtime.world_size > 1:
                self._collectives = GroupCollectives(timeout_s=self.runtime.timeout_s)
            self.writer = AsyncCheckpointWriter()
        return self.writer

    def _say(self, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            logger.warning("async_save: checkpoints are written synchronously: %s.", reason)

    # -- the background write ------------------------------------------------------------------
    def _poll_writer(self) -> None:
        """`poll` with async_save: finish the pending write if it is durable on every process."""
        writer = self.writer
        if writer is None or not writer.pending:
            return
        ready = writer.ready
        if self.runtime.distributed:
            ready = not self.runtime.any_process(not ready)
        if ready:
            writer.wait()  # returns at once here, or after the last moments of this process's thread

    def wait(self) -> None:
        """Finish the pending write (its completion work runs here); raises its error."""
        if self.writer is not None:
            self.writer.wait()

    def abandon(self) -> None:
        """`train()` is leaving on an exception: let the write in flight finish, skip its completion
        work, and report its error without replacing the exception in flight."""
        writer = self.writer
        if writer is None or not writer.pending:
            return
        error = writer.drain(cancel=isinstance(sys.exc_info()[1], KeyboardInterrupt))  # Ctrl-C: not committed
        if error is None:
            return
        logger.error("%s", error)
        current = sys.exc_info()[1]
        if current is not None and hasattr(current, "add_note"):
            current.add_note(f"while a checkpoint was being written in the background: {error}")

    # -- restoring -----------------------------------------------------------------------------
    def restore(self, path: str, trainer: CheckpointedTrainer, run: TrainingRun) -> None:
        """Load everything checkpoint `path` holds into `run`, through the same parts a save writes;
        each part refuses (before anything loads) what does not fit this run. What the data state's
        check found (a re-sized schedule) is applied here, to the run's plan and the TrainerState."""
        parts = build_parts(
            trainer, run, self.runtime, overridden=self.overridden, main=self.main, restore_from=path
        )
        if self.args.save_only_model and self.manager.has(path, "optimizer"):
            logger.warning("save_only_model=True: resuming the weights of %s with a fresh optimizer.", path)
        # a subclass's `_load_optimizer_and_scheduler` is called as upstream calls it: after the rest,
        # loading the optimizer and the schedule through its super() (or not), then its own state
        hooked = "_load_optimizer_and_scheduler" in self.overridden
        deferred = {name: parts.pop(name) for name in OPTIMIZER_PARTS if name in parts} if hooked else {}
        self.manager.load(path, parts)
        found = parts["data_state"].found
        if found.resized_to is not None:  # a run sized by epochs, resumed in another batch geometry
            run.plan = dataclasses.replace(run.plan, max_steps=found.resized_to)
            trainer.state.max_steps = found.resized_to
        if hooked:
            self._deferred = deferred
            try:
                trainer._load_optimizer_and_scheduler(path)
            finally:
                self._deferred = None
        cursor = run.position.cursor
        # data_state.json's, not trainer_state's
        trainer.state.optimizer_step_attempts = cursor.steps_attempted
        self._say_if_nothing_left(path, trainer.state.global_step, run.plan, cursor.epoch)
        logger.info(
            "Resumed from %s at step %d (epoch %d, batch %d of it).",
            path,
            cursor.steps_applied,
            cursor.epoch,
            cursor.batch_in_epoch,
        )

    def load_optimizer_and_scheduler(self, path: str, trainer: CheckpointedTrainer, run: TrainingRun) -> None:
        """`Trainer._load_optimizer_and_scheduler`: the optimizer's and the schedule's state of
        checkpoint `path` (during a resume, the parts `restore` left to the hook)."""
        parts = self._deferred
        if parts is None:
            built = build_parts(
                trainer, run, self.runtime, overridden=self.overridden, main=self.main, restore_from=path
            )
            parts = {name: built[name] for name in OPTIMIZER_PARTS if name in built}
        self.manager.load(path, parts)

    def _say_if_nothing_left(self, path: str, step: int, plan: Any, epoch: int) -> None:
        """A resume whose checkpoint is already at (or past) this run's end trains no step: say so."""
        args = self.args
        if step < plan.max_steps and epoch < plan.epochs:
            return
        by_steps = args.max_steps > 0
        limit = f"max_steps={plan.max_steps}" if by_steps else f"num_train_epochs={args.num_train_epochs}"
        logger.warning(
            "Resuming %s at step %d (epoch %d), and this run ends at %s: train() returns after 0 steps. "
            "Raise %s to train further.",
            path,
            step,
            epoch,
            limit,
            "max_steps" if by_steps else "num_train_epochs",
        )

    def keep_only_best(self, state: Any, divergence: Divergence) -> None:
        """With save_total_limit=1, keep only this run's best checkpoint once training is over
        (upstream), and what rotation keeps besides: checkpoints of another run in the folder, and the
        last one written before the loss went non-finite."""
        args = self.args
        if (
            args.save_total_limit != 1
            or state.best_model_checkpoint is None
            or not self.runtime.is_main_process
        ):
            return
        ckpt.refuse_if_moved(self.folder)
        kept = {os.path.abspath(p) for p in [state.best_model_checkpoint, *self.foreign]}
        kept.update(os.path.abspath(p) for p in divergence.kept())
        for path in ckpt.sort_checkpoints(self.folder):
            if os.path.abspath(path) not in kept:
                logger.info("Deleting %s (save_total_limit=1 keeps the best checkpoint).", path)
                ckpt.delete_checkpoint(path)


def _durable(trainer: CheckpointedTrainer, fire: Fire, path: str, saved_state: Any) -> None:
    """Completion work of a durable background checkpoint, in the training thread: the Hub push and
    `on_save` (given the saved step's state)."""
    if trainer.args.push_to_hub:
        trainer._push_from_checkpoint(path)
    control = trainer.control
    # The flag of a save being decided now (this can run inside the next save step) is not this
    # event's to clear.
    saving_now = control.should_save
    fire("on_save", state=saved_state)
    trainer.control.should_save = saving_now or trainer.control.should_save


def load_rng_state(args: Any, runtime: Any, path: str) -> None:
    """`Trainer._load_rng_state`: this process's RNG file of a checkpoint (the "rng" part)."""
    CheckpointManager(runtime, main=writes_once(args, runtime)).load(path, {"rng": RngState()})


def _nothing() -> None:
    return None

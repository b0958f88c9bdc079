"""`async_save=True`: the Trainer's checkpoints written in the background while training goes on.

At a save step `save` takes the checkpoint's mapping of parts (`checkpointing.checkpoint_parts`),
copies it into reused host memory and hands the writing to `AsyncCheckpointWriter`'s thread; the
files, the hidden folder, the fsyncs, the manifest and the rename are those of a synchronous save.
The Trainer then calls:

* `poll` at the end of every step: once the write is durable on every process, the completion
  work runs in the training thread: rotation (in `save_checkpoint_async`), the Hub push of the
  checkpoint, and the `on_save` event. `on_save` therefore marks the moment the checkpoint is on
  disk and complete, at the first step end after that; it receives the TrainerState of the saved step
  (its `global_step` names the folder), and the live `TrainerControl`;
* `wait` before anything that needs the checkpoint on disk or the writer idle: the next save (inside
  `save_checkpoint_async`), `save_model`, the end of `train()` before the best model is loaded and
  before a preemption's exit;
* `abandon` when `train()` is leaving on an exception: the write in flight is finished (a complete
  checkpoint, or none) without the completion work, and a write error is logged and noted on
  the exception instead of replacing it.

A save the snapshot can't serve is written synchronously (`sync_reason` says why, logged once): a
subclass that overrides `_save_checkpoint`, `_save` or `save_model` (the override is called as
upstream calls it, in the training thread), and engines whose checkpoint parts can't be staged
(DeepSpeed's engine checkpoint).

Several processes: the writer threads commit through a gloo group of their own (`GroupCollectives`,
created at the first asynchronous save, which every process reaches at the same step), and `poll`
finishes a write only when every process's write is done (one CPU all-reduce per step while a write
is pending), so completion work and `on_save` happen at the same step everywhere.
"""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

from trainwright.checkpoint.async_writer import (
    AsyncCheckpointWriter,
    GroupCollectives,
    save_checkpoint_async,
)
from trainwright.loop import checkpointing

logger = logging.getLogger(__name__)

# Upstream hooks that, when a subclass overrides them, must run as upstream runs them (in the
# training thread, on the live model): their saves are synchronous.
_HOOKS = ("_save_checkpoint", "_save", "save_model")


def sync_reason(trainer: Any) -> str | None:
    """Why a checkpoint of `trainer` can't be written in the background, or None."""
    overridden = [name for name in _HOOKS if trainer._overrides(name)]
    if overridden:
        return f"the Trainer subclass overrides {', '.join(overridden)}"
    return None


def writer(trainer: Any) -> AsyncCheckpointWriter:
    """The Trainer's writer, created at its first asynchronous save (with its process group)."""
    if trainer._checkpoint_writer is None:
        runtime = trainer.runtime
        if runtime.world_size > 1:
            trainer._checkpoint_collectives = GroupCollectives(timeout_s=runtime.timeout_s)
        trainer._checkpoint_writer = AsyncCheckpointWriter()
    return trainer._checkpoint_writer


def save(trainer: Any) -> str | None:
    """Write checkpoint-<global_step>: in the background (returns None; the completion work runs
    when it is durable), or synchronously where it must be (returns its path; the reason is logged
    once)."""
    reason = sync_reason(trainer)
    if reason is not None:
        _log_once(trainer, reason)
        wait(trainer)
        return checkpointing.save(trainer)
    w = writer(trainer)
    wait(trainer)  # before the checkpoint's contents are decided, as after a synchronous save

    def background(manager: Any, folder: str, name: str, parts: Any, **kwargs: Any) -> bool:
        # on_save gets the state of the saved step; a shallow copy: its counters stay, lists are shared
        saved_state = copy.copy(trainer.state)
        return save_checkpoint_async(
            w,
            manager,
            folder,
            name,
            parts,
            collectives=trainer._checkpoint_collectives,
            on_done=lambda path: _durable(trainer, path, saved_state),
            **kwargs,
        )

    path = checkpointing.save(trainer, background=background)
    if path is not None:
        _log_once(trainer, "a checkpoint part can't be staged (DeepSpeed's engine checkpoint)")
    return path


def _durable(trainer: Any, path: str, saved_state: Any) -> None:
    """Completion work of a durable checkpoint, in the training thread."""
    if trainer.args.push_to_hub:
        trainer._push_from_checkpoint(path)
    # The flag of a save being decided now (this can run inside the next save step) is not this
    # event's to clear.
    saving_now = trainer.control.should_save
    trainer.control = trainer.callback_handler.on_save(trainer.args, saved_state, trainer.control)
    trainer.control.should_save = saving_now or trainer.control.should_save


def defer_on_save(trainer: Any) -> bool:
    """After `_save_checkpoint` in the loop: True when the checkpoint went to the background, so
    `on_save` waits for it to be durable (`should_save` is cleared now, as `on_save` would)."""
    w = trainer._checkpoint_writer
    if w is None or not w.pending:
        return False
    trainer.control.should_save = False
    return True


def poll(trainer: Any) -> None:
    """At a step end: finish the pending write if it is durable on every process."""
    w = trainer._checkpoint_writer
    if w is None or not w.pending:
        return
    ready = w.ready
    if trainer.runtime.distributed:
        ready = not trainer.runtime.any_process(not ready)
    if ready:
        w.wait()  # returns at once here, or after the last moments of this process's thread


def wait(trainer: Any) -> None:
    """Finish the pending write (its completion work runs here); raises its error."""
    w = trainer._checkpoint_writer
    if w is not None:
        w.wait()


def abandon(trainer: Any) -> None:
    """`train()` is leaving on an exception: let the write in flight finish, skip its completion
    work, and report its error without replacing the exception in flight."""
    w = trainer._checkpoint_writer
    if w is None or not w.pending:
        return
    error = w.drain()
    if error is None:
        return
    logger.error("%s", error)
    current = sys.exc_info()[1]
    if current is not None and hasattr(current, "add_note"):
        current.add_note(f"while a checkpoint was being written in the background: {error}")


def _log_once(trainer: Any, reason: str) -> None:
    said = trainer.__dict__.setdefault("_async_save_said", set())
    if reason not in said:
        said.add(reason)
        logger.warning("async_save: checkpoints are written synchronously: %s.", reason)

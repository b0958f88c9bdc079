"""The position's checkpoint parts: "data_state" (`DataState`: the run's `Position`, its loss
windows and the sampler's position; its check refuses a changed batch geometry and returns what it
found, a `PositionFinding` the checkpointer applies) and "batch_in_hand" (`BatchInHand`: the
training batch fetched ahead of the next step, where the run can store it)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import trainwright.checkpoint as ckpt
from trainwright.core.state import LoopCursor, TrainerState
from trainwright.data.kinds import fingerprint
from trainwright.data.look_ahead import LookAhead, batch_from_state
from trainwright.loop.checkpoints import resume
from trainwright.loop.run.loss_log import LossLog
from trainwright.loop.run.plan import RunPlan
from trainwright.loop.run.position import Position


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

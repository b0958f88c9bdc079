"""`Position`: where a run is in its data, the part of a run that the "data_state" checkpoint part
saves and restores (`data_state.DataState` reads and loads it).

The loop cursor (`LoopCursor`: steps, epoch, batch and samples in it, the counters a checkpoint
keeps), the epoch's batch geometry, the training batches fetched one ahead (`LookAhead`: the batch
in hand is a checkpoint's), whether an iterable dataset's own state came back, whether a preemption
cut the last evaluation short, and the step being taken (its micro-batches, how many are counted).
It holds no reference to the run or the Trainer: it is built from the loader and the counting
callables the run's plan decided.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from trainwright import data as data_utils
from trainwright.checkpoint.rng import capture_rng_state, restore_rng_state
from trainwright.core.state import LoopCursor, TrainerState
from trainwright.data.look_ahead import END, LookAhead
from trainwright.modeling.loss import batch_size


class Position:
    """A run's position in its data and the micro-batch counters of the step being taken."""

    __slots__ = (
        "dataloader",
        "cursor",
        "geometry",
        "look_ahead",
        "iterable_restored",
        "evaluation_pending",
        "resumed_loader",
        "count_flops",
        "count_input_tokens",
        "step_micro_batches",
        "step_position",
    )

    def __init__(
        self,
        dataloader: Any,
        steps_in_epoch: int,
        count_flops: Callable[[Any, int], Any],
        count_input_tokens: Callable[[Mapping[str, Any]], int],
        resumed_loader: Callable[[Any, int], Any] | None = None,
    ) -> None:
        self.dataloader = dataloader
        self.cursor = LoopCursor(steps_in_epoch=steps_in_epoch)
        # batches cut in order from a resumable sampler: each one's number of samples is known exactly
        self.geometry = data_utils.sampler_geometry(dataloader)
        # the training batches, each fetched one ahead as accelerate's loader fetches them; the batch
        # in hand is a checkpoint's (stored, or fetched again from its RNG state)
        self.look_ahead = LookAhead(checkpointed=True)
        self.iterable_restored = False  # an iterable dataset's own state came back: skip nothing
        self.evaluation_pending = False  # a preemption cut the last evaluation short (resume runs it)
        # a Trainer subclass's get_resumed_dataloader: it skips a resumed epoch's seen batches
        self.resumed_loader = resumed_loader
        self.count_flops, self.count_input_tokens = count_flops, count_input_tokens
        # the step being taken: its micro-batches, and how many of them advance() has counted
        self.step_micro_batches = self.step_position = 0

    def resume_at(
        self, cursor: LoopCursor, evaluation_pending: bool, iterable_restored: bool = False
    ) -> None:
        """A checkpoint's position: the cursor, whether its evaluation still has to run, and whether
        an iterable dataset's own state came back (then it skips nothing)."""
        self.cursor = cursor
        self.evaluation_pending = evaluation_pending
        self.iterable_restored = iterable_restored
        if (cursor.epoch or cursor.batch_in_epoch) and hasattr(self.dataloader, "started"):
            self.dataloader.started = True  # the run it continues iterated it already (persistent workers)

    def epoch_batches(self, epoch: int) -> Iterator[Any]:
        """This epoch's batches, each fetched one ahead, starting after those a resumed run already
        consumed (a checkpoint's batch in hand first: `LookAhead.epoch`)."""
        dataloader = self.dataloader
        sampler: Any = getattr(dataloader, "sampler", None)
        obj: Any
        for obj in (
            dataloader,
            sampler,
            getattr(dataloader, "batch_sampler", None),
            getattr(dataloader, "dataset", None),
        ):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)
        if self.resumed_loader is not None and self.cursor.batch_in_epoch and not self.iterable_restored:
            # a subclass's get_resumed_dataloader gives the epoch's rest: the batch in hand comes from it
            self.look_ahead.forget_resume()
            batches = self._resumed_by_override(dataloader, sampler)
            return self.look_ahead.over(lambda: (batches, next(batches, END)))
        restored, self.iterable_restored = self.iterable_restored, False
        cursor = self.cursor
        return self.look_ahead.epoch(
            dataloader, cursor.batch_in_epoch, cursor.samples_in_epoch, self.geometry, restored
        )

    def _resumed_by_override(self, dataloader: Any, sampler: Any) -> Iterator[Any]:
        """A resumed epoch's batches from the subclass's `get_resumed_dataloader`, given the whole
        epoch's loader and the micro-batches to skip, as upstream calls it. What the call itself loads
        (an eager skip) does not move the checkpoint's RNG state."""
        if hasattr(sampler, "set_start"):
            sampler.set_start(0)  # a restored sampler position would skip the batches twice
        assert self.resumed_loader is not None
        rng = capture_rng_state()
        batches = iter(self.resumed_loader(dataloader, self.cursor.batch_in_epoch))
        restore_rng_state(rng)
        return batches

    def begin_step(self, micro_batches: list) -> int:
        """A step of these micro-batches starts; the index of its last one."""
        self.step_micro_batches, self.step_position = len(micro_batches), 0
        return self.step_micro_batches - 1

    def at_step_boundary(self) -> bool:
        """Whether the micro-batch being trained is its step's last (or no step is under way):
        accelerate's `sync_gradients`."""
        return self.step_position >= self.step_micro_batches

    def advance(self, inputs: Any, state: TrainerState) -> None:
        """Count one micro-batch into the cursor: samples, tokens, FLOPs, input tokens seen."""
        cursor, geometry = self.cursor, self.geometry
        self.step_position += 1
        n = min(geometry[0], geometry[1] - cursor.samples_in_epoch) if geometry else batch_size(inputs)
        cursor.batch_in_epoch += 1
        cursor.samples_in_epoch += n
        cursor.samples_seen += n
        is_mapping = type(inputs) is dict or isinstance(inputs, Mapping)  # dict: skip the ABC check
        ids = inputs.get("input_ids") if is_mapping else None
        tokens = ids.numel() if isinstance(ids, torch.Tensor) else 0
        cursor.tokens_seen += tokens
        cursor.flops_seen += self.count_flops(inputs, tokens or n)
        if is_mapping:
            state.num_input_tokens_seen += self.count_input_tokens(inputs)

    def next_epoch(self, epoch: int) -> None:
        """Epoch `epoch` is over: the cursor at the next one's start, no batch in hand."""
        cursor = self.cursor
        cursor.epoch, cursor.batch_in_epoch, cursor.samples_in_epoch = epoch + 1, 0, 0
        self.look_ahead.drop()  # a batch fetched ahead of a stopped epoch is not the next one

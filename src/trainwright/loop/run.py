"""`TrainingRun`: the state of one `train()` call (one try of `auto_find_batch_size`).

Everything that lives for one run and that transformers' Trainer does not have as an attribute is
here, not on the Trainer: the engine (how the backend steps and checkpoints), the loop cursor and
the epoch's batch geometry, the window of unlogged step losses (read into log rows here), the preemption guard, the
checkpointer, the counters at the start of the call, the last step's gradient norm and learning
rate, and the decisions taken once per run (exact FLOP counting, an overriding
`_maybe_log_save_evaluate`, a metric-driven scheduler, a schedule-free optimizer's `train`).

The Trainer builds a run in `_inner_training_loop` (`Trainer._run` then points at it, and keeps
pointing at the last one after `train()` returns, for `cursor`, `current_flos` and `deepspeed`);
a retry of `auto_find_batch_size` builds a new one. The per-step helpers below are what one
optimizer step calls besides the Trainer's overridable hooks and the engine.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import torch
from torch import nn

from trainwright import data as data_utils
from trainwright.checkpoint.rng import capture_rng_state, restore_rng_state
from trainwright.core.preemption import PreemptionGuard
from trainwright.core.state import LoopCursor, TrainerControl, TrainerState
from trainwright.data.look_ahead import END, LookAhead
from trainwright.distributed.engine import Engine
from trainwright.distributed.engines import build_engine
from trainwright.loop import plugins
from trainwright.loop.divergence import Divergence
from trainwright.loop.plugins import PlugIn
from trainwright.loop.train_mode import TrainMode
from trainwright.modeling.loss import LossWindow, WindowReading, batch_size
from trainwright.modeling.step_weights import StepWeights
from trainwright.observe.flops import non_embedding_parameters
from trainwright.optim.zeroing import grads_to_none

logger = logging.getLogger(__name__)

MAX_UNLOGGED_STEPS = 4096  # step losses kept for the next log row before they are folded into train_loss


class TrainingRun:
    """One run's state and the per-step bookkeeping around the Trainer's hooks."""

    # slots: CPython specializes attribute and method lookups on them (a dict of more than 30 keys,
    # as this run would have, is never specialized)
    __slots__ = (
        "args",
        "runtime",
        "device",
        "distributed",
        "data_world_size",
        "_agree",
        "dataloader",
        "epochs",
        "max_steps",
        "trial",
        "ignore_keys_for_eval",
        "cursor",
        "geometry",
        "engine",
        "losses",
        "weights",
        "preemption",
        "checkpointer",
        "flops_per_token",
        "count_flops",
        "count_input_tokens",
        "grad_norm",
        "last_lr",
        "start_time",
        "samples_at_start",
        "tokens_at_start",
        "input_tokens_at_start",
        "iterable_restored",
        "resumed_loader",
        "eval_stops_on_preemption",
        "evaluation_pending",
        "divergence",
        "custom_lse",
        "metric_scheduler",
        "train_mode",
        "zero_grad",
        "step_micro_batches",
        "step_position",
        "look_ahead",
        "_attached",
        "__weakref__",  # the parts that call back into the run (weights, checkpointer) hold it weakly
    )

    def __init__(
        self,
        args: Any,
        runtime: Any,
        model: nn.Module,
        dataloader: Any,
        *,
        epochs: int,
        max_steps: int,
        steps_in_epoch: int,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        count_flops: Callable[[Any], Any] | None = None,
        weights: Callable[[Callable[[], None]], StepWeights],
        resumed_loader: Callable[[Any, int], Any] | None = None,
    ) -> None:
        self.args, self.runtime, self.device = args, runtime, runtime.device
        # facts of the processes, fixed for the run (read every step: plain attributes, not properties)
        self.distributed, self.data_world_size = runtime.distributed, runtime.data_world_size
        # a flag every process must agree on (any of them): with one process, the flag itself
        self._agree: Callable[[bool], bool] = runtime.any_process if self.distributed else bool
        self.dataloader = dataloader
        self.epochs, self.max_steps = epochs, max_steps
        self.trial, self.ignore_keys_for_eval = trial, ignore_keys_for_eval
        self.cursor = LoopCursor(steps_in_epoch=steps_in_epoch)
        # batches cut in order from a resumable sampler: each one's number of samples is known exactly
        self.geometry = data_utils.sampler_geometry(dataloader)
        self.engine: Engine = build_engine(args, runtime, model)
        self.losses = LossWindow(runtime.device)
        self.weights = weights(self.note_empty_step)  # how micro-batch losses make the step's
        self.preemption = PreemptionGuard(args.preemption_signals)
        self.checkpointer: Any = None  # the Trainer's Checkpointer for this run (set when it is built)
        # FLOPs of a micro-batch from it and its tokens (else samples): an overridden
        # floating_point_ops, or a callback that needs exact FLOPs, counts each batch; else
        # upstream's total_flos estimate, 6 x non-embedding parameters per token
        self.flops_per_token = per_token = 6 * non_embedding_parameters(model)
        self.count_flops: Callable[[Any, int], Any]
        if count_flops is not None:
            self.count_flops = lambda inputs, _tokens: count_flops(inputs)
        else:
            self.count_flops = lambda _inputs, tokens: per_token * tokens
        mode = args.include_num_input_tokens_seen  # "no", "all" or "non_padding"
        self.count_input_tokens: Callable[[Mapping[str, Any]], int] = (
            _no_tokens if mode == "no" else partial(_input_tokens, mode=mode)
        )
        self.grad_norm: torch.Tensor | float | None = None
        self.last_lr: float | None = None  # the rate the last step applied
        self.start_time = time.time()
        self.samples_at_start = self.tokens_at_start = self.input_tokens_at_start = 0
        self.iterable_restored = False  # an iterable dataset's own state came back: skip nothing
        # a Trainer subclass's get_resumed_dataloader: it skips a resumed epoch's seen batches
        self.resumed_loader = resumed_loader  # a subclass's get_resumed_dataloader
        self.eval_stops_on_preemption = False  # True while the loop's own evaluation runs
        self.evaluation_pending = False  # a preemption cut the last evaluation short (resume runs it)
        self.divergence = Divergence()  # the first non-finite step, the last checkpoint before it
        self.custom_lse = False  # a subclass overrides _maybe_log_save_evaluate: called every step
        self.metric_scheduler = False  # the scheduler steps on the evaluation metric, not per step
        self.train_mode = TrainMode()  # model.train() (and a schedule-free optimizer's) per micro-batch
        self.zero_grad: Callable[[], None] = _nothing  # the optimizer's, bound in start()
        # the step being taken: its micro-batches, and how many of them advance() has counted
        self.step_micro_batches = self.step_position = 0
        # the training batches, each fetched one ahead as accelerate's loader fetches them; the batch
        # in hand is a checkpoint's (stored, or fetched again from its RNG state)
        self.look_ahead = LookAhead(checkpointed=True)
        self._attached = contextlib.ExitStack()  # plug-ins' hooks on this run's module, off when it ends

    # -- set-up --------------------------------------------------------------------------------
    def start(
        self,
        optimizer: Any,
        state: TrainerState,
        added: list[PlugIn],
        metric_scheduler: bool,
        custom_lse: bool,
    ) -> None:
        """After the optimizer exists and a checkpoint (if any) is restored: the counters this call
        starts from, the loss window it continues, the plug-ins it runs with."""
        cursor = self.cursor
        cursor.first_step_of_call = cursor.steps_applied
        self.samples_at_start, self.tokens_at_start = cursor.samples_seen, cursor.tokens_seen
        self.input_tokens_at_start = state.num_input_tokens_seen
        self.losses.load(cursor.loss_window)
        self.metric_scheduler, self.custom_lse = metric_scheduler, custom_lse
        self.train_mode = TrainMode(optimizer)
        self._attached = plugins.around_run(added, self.engine.module, state)
        self.zero_grad = grads_to_none(optimizer)
        self.zero_grad()
        self.start_time = time.time()

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

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """The loop's own evaluation runs: a preemption stops it at its next batch (`preempted`)."""
        self.eval_stops_on_preemption = True
        try:
            yield
        finally:
            self.eval_stops_on_preemption = False

    def evaluation_ran(self, completed: bool) -> None:
        """The loop's evaluation ended: completed, or cut short by a preemption (a resume runs it first)."""
        self.evaluation_pending = not completed

    def resize(self, max_steps: int, state: TrainerState) -> None:
        """A resume in another batch geometry re-sized a run sized by epochs: `max_steps` now."""
        self.max_steps = state.max_steps = max_steps

    def close(self) -> None:
        """The run is over: its model hooks come off, the batch in hand goes."""
        self._attached.close()
        self.look_ahead.drop()

    # -- one step ------------------------------------------------------------------------------
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

    def finish_step(
        self, applied: bool, grad_norm: Any, optimizer: Any, scheduler: Any, state: TrainerState
    ) -> None:
        """After the optimizer step: its gradient norm, the rate it applied, the schedule, zeroed
        gradients, counters."""
        self.grad_norm, self.last_lr = grad_norm, optimizer.param_groups[0]["lr"]
        if applied and not self.metric_scheduler:
            scheduler.step()
        self.zero_grad()
        cursor = self.cursor
        cursor.steps_attempted += 1
        cursor.steps_applied += int(applied)
        cursor.steps_since_log += 1
        self.sync_state(state)

    def sync_state(self, state: TrainerState) -> None:
        """TrainerState's counters, derived from the cursor."""
        cursor = self.cursor
        state.global_step = cursor.steps_applied
        state.optimizer_step_attempts = cursor.steps_attempted
        state.epoch = cursor.fractional_epoch
        state.total_flos = cursor.flops_seen * self.data_world_size  # peers sharing a batch: once

    def preempted(self) -> bool:
        """Whether a preemption signal arrived (on any process: every process stops at the same step)."""
        return self._agree(self.preemption.requested is not None)

    def window_row(
        self, global_step: int, grad_norm: Any = None, learning_rate: float | None = None
    ) -> dict[str, float]:
        """The log row of the unlogged steps (read out of the window): their mean loss, the steps
        without targets or with non-finite losses, the last gradient norm and learning rate."""
        steps = self.cursor.steps_since_log
        reading = self.read_loss_window(global_step)
        logs: dict[str, float] = {"loss": reading.total / reading.counted} if reading.counted else {}
        if reading.nonfinite:
            logs["nonfinite_steps"] = reading.nonfinite
        empty = steps - reading.counted - reading.filtered
        if empty:  # steps whose batches held no label target: no loss, no update
            logs["steps_without_targets"] = empty
        if grad_norm is not None:
            logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
        if learning_rate is not None:
            logs["learning_rate"] = float(learning_rate)
        return logs

    def read_loss_window(self, global_step: int) -> WindowReading:
        """Read the unlogged steps' losses into the cursor's running total (non-finite steps are
        warned about by step, and the first is remembered: the last checkpoint before it is kept)."""
        cursor, filtering = self.cursor, self.args.logging_nan_inf_filter
        reading = self.losses.read(cursor.steps_since_log, self.runtime, filtering)
        first = global_step - cursor.steps_since_log + 1
        if reading.first_nonfinite is not None:
            self.divergence.note(first + reading.first_nonfinite)
            every = not math.isfinite(reading.total)
            if not every:
                how = " (left out of the logged mean: logging_nan_inf_filter)"
            elif filtering:
                how = " (every one: filtered out by logging_nan_inf_filter, the row has no loss)"
            else:
                how = " (every one: the logged loss is NaN)"
            logger.warning(
                "Non-finite training loss in %d of the steps %d-%d%s.",
                reading.nonfinite,
                first,
                global_step,
                how,
            )
            if every and filtering:  # nothing finite to average: these steps have no loss, as empty ones
                cursor.steps_without_targets += reading.counted
                reading = reading._replace(total=0.0, counted=0, filtered=reading.counted)
        cursor.loss_logged_total += reading.total
        cursor.steps_since_log = 0
        return reading

    def gather_loss_windows(self, global_step: int) -> list[list[float | None]]:
        """For a checkpoint (every process calls it): every process's unlogged step losses; this
        process's go into the cursor, and a non-finite one is noted (this checkpoint is not finite)."""
        windows = self.runtime.all_gather_object(self.losses.values(self.cursor.steps_since_log))
        self.cursor.loss_window = windows[self.runtime.rank]
        offsets = [i for w in windows for i, v in enumerate(w) if v is not None and not math.isfinite(v)]
        if offsets:
            self.divergence.note(global_step - self.cursor.steps_since_log + 1 + min(offsets))
        return windows

    def note_empty_step(self) -> None:
        """The step being taken has no label target on any process: it records no loss."""
        self.losses.mark_empty(self.cursor.steps_since_log)
        self.cursor.steps_without_targets += 1

    def stop_if_preempted(self, control: TrainerControl) -> None:
        if self._agree(self.preemption.requested is not None):  # preempted(), without a call
            control.should_save = control.should_training_stop = True

    def log_due(self, control: TrainerControl) -> bool:
        """Whether `_maybe_log_save_evaluate` has anything to do after this step."""
        return (  # an overriding subclass sees every step, as upstream calls it every step
            self.custom_lse
            or control.should_log
            or control.should_evaluate
            or control.should_save
            or self.cursor.steps_since_log >= MAX_UNLOGGED_STEPS  # window_full(), without a call
        )

    def window_full(self) -> bool:
        """Whether the unlogged step losses fill their bound (then they are folded into train_loss)."""
        return self.cursor.steps_since_log >= MAX_UNLOGGED_STEPS

    def end_epoch(self, epoch: int, steps: int, exhausted: bool, control: TrainerControl) -> None:
        """After an epoch's last step: refuse a run that never got a batch, stop at an iterable that
        ran dry, and move the cursor to the next epoch unless the run stopped inside this one."""
        cursor = self.cursor
        if steps == 0 and cursor.batch_in_epoch == 0:
            if cursor.steps_attempted == 0:  # not one batch in the whole run: refuse, never "succeed"
                raise ValueError(empty_training_message(self.dataloader, self.args, self.runtime.world_size))
            logger.warning(  # as upstream: an iterable that ran dry before max_steps
                "Epoch %d produced no batch: stopping training at step %d of max_steps=%d.",
                epoch,
                cursor.steps_applied,
                self.max_steps,
            )
            control.should_training_stop = True
        # A run stopped mid-epoch keeps its position there, so a resume continues the same epoch.
        done = cursor.steps_in_epoch > 0 and cursor.batch_in_epoch >= cursor.steps_in_epoch
        if exhausted or control.should_epoch_stop or done:
            cursor.epoch, cursor.batch_in_epoch, cursor.samples_in_epoch = epoch + 1, 0, 0
            self.look_ahead.drop()  # a batch fetched ahead of a stopped epoch is not the next one

    # -- the end -------------------------------------------------------------------------------
    def train_loss(self) -> float:
        """The mean loss of the run's steps that had a loss (logged windows, folded in); NaN, said
        once, when no step of the run had a label target (there is no loss to average)."""
        cursor = self.cursor
        counted = cursor.steps_attempted - cursor.steps_without_targets
        if cursor.steps_attempted and counted <= 0:
            logger.warning(
                "No step of this run had a label target (every label -100, or samples too short to "
                "predict a next token), so nothing was learned: train_loss is NaN."
            )
            return float("nan")
        return cursor.loss_logged_total / max(counted, 1)

    def samples_and_tokens_run(self) -> tuple[int, int]:
        """Samples and tokens this call trained on, over every data-parallel rank."""
        world, cursor = self.runtime.data_world_size, self.cursor
        return (
            (cursor.samples_seen - self.samples_at_start) * world,
            (cursor.tokens_seen - self.tokens_at_start) * world,
        )


def empty_training_message(dataloader: Any, args: Any, world_size: int) -> str:
    """Why a run got no batch, and the ways out that apply (a run never "succeeds" without one)."""
    dataset: Any = getattr(dataloader, "dataset", None)
    if data_utils.has_length(dataset):
        what = f"train_dataset ({type(dataset).__name__}) has {len(dataset)} samples"
    else:
        what = f"train_dataset ({type(dataset).__name__}, an iterable) yielded no sample"
    fixes = ["more samples"]
    if args.dataloader_drop_last:  # only then can a batch size or the last partial batch matter
        fixes += ["a smaller per_device_train_batch_size", "dataloader_drop_last=False"]
    return (
        f"The training data gives no batch: {what}, per_device_train_batch_size="
        f"{args.per_device_train_batch_size}, processes={world_size}, dataloader_drop_last="
        f"{args.dataloader_drop_last}. Give it {' or '.join(fixes)}."
    )


def _no_tokens(inputs: Mapping[str, Any]) -> int:
    return 0


def _nothing() -> None:
    return None


def _input_tokens(inputs: Mapping[str, Any], mode: str) -> int:
    """`include_num_input_tokens_seen`: every input token, or with "non_padding" the attended ones."""
    mask = inputs.get("attention_mask")
    if mode == "non_padding" and isinstance(mask, torch.Tensor):
        return int(mask.sum())
    ids = inputs.get("input_ids")
    return ids.numel() if isinstance(ids, torch.Tensor) else 0

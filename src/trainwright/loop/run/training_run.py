"""`TrainingRun`: the state of one `train()` call (one try of `auto_find_batch_size`), in owned parts.

Everything that lives for one run and that transformers' Trainer does not have as an attribute is
here, not on the Trainer, each in a part of its own that holds nothing back up the tree: the plan
(`RunPlan`: the decisions taken once, frozen), the counters at the start of the call (`RunStart`), the
position in the data (`Position`: the cursor, the batch geometry, the batch in hand; what the
"data_state" checkpoint part saves), the loss log (`LossLog`: the unlogged step losses, the
divergence note), the engine (how the backend steps and checkpoints), the step weights, the
preemption guard, the checkpointer, the last step's gradient norm and learning rate.

The Trainer builds a run in `_inner_training_loop` (`Trainer._run` then points at it, and keeps
pointing at the last one after `train()` returns, for `cursor`, `current_flos` and `deepspeed`);
a retry of `auto_find_batch_size` builds a new one. The per-step helpers below are what one
optimizer step calls besides the Trainer's overridable hooks, the position's counting and the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from trainwright import data as data_utils
from trainwright.core.preemption import PreemptionGuard
from trainwright.core.state import TrainerControl, TrainerState
from trainwright.distributed.engine import Engine
from trainwright.distributed.engines import build_engine
from trainwright.loop.run.loss_log import LossLog
from trainwright.loop.run.plan import RunPlan, RunStart, flop_counter, input_token_counter
from trainwright.loop.run.position import Position
from trainwright.loop.run.train_mode import TrainMode
from trainwright.modeling.step_weights import StepWeights
from trainwright.observe.flops import non_embedding_parameters
from trainwright.optim.zeroing import grads_to_none

logger = logging.getLogger(__name__)

MAX_UNLOGGED_STEPS = 4096  # step losses kept for the next log row before they are folded into train_loss


class TrainingRun:
    """One run's parts and the per-step bookkeeping around the Trainer's hooks."""

    # slots: CPython specializes attribute and method lookups on them
    __slots__ = (
        "args",
        "runtime",
        "plan",
        "start_counters",
        "position",
        "engine",
        "losses",
        "weights",
        "preemption",
        "checkpointer",
        "last_step",
        "eval_stops_on_preemption",
        "train_mode",
        "zero_grad",
        "_attached",
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
        checkpointer: Any,
        weights: Callable[[Callable[[], None]], StepWeights],
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        count_flops: Callable[[Any], Any] | None = None,
        resumed_loader: Callable[[Any, int], Any] | None = None,
        custom_lse: bool = False,
    ) -> None:
        self.args, self.runtime = args, runtime
        distributed = runtime.distributed
        self.plan = plan = RunPlan(
            epochs=epochs,
            max_steps=max_steps,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            count_flops=flop_counter(count_flops, 6 * non_embedding_parameters(model)),
            count_input_tokens=input_token_counter(args.include_num_input_tokens_seen),
            custom_lse=custom_lse,
            resumed_loader=resumed_loader,
            distributed=distributed,
            data_world_size=runtime.data_world_size,
            agree=runtime.any_process if distributed else bool,
        )
        self.start_counters = RunStart()
        self.position = Position(
            dataloader, steps_in_epoch, plan.count_flops, plan.count_input_tokens, resumed_loader
        )
        self.engine: Engine = build_engine(args, runtime, model)
        self.losses = LossLog(self.position, runtime, args.logging_nan_inf_filter)
        self.weights = weights(self.losses.note_empty_step)  # how micro-batch losses make the step's
        self.preemption = PreemptionGuard(args.preemption_signals)
        self.checkpointer = checkpointer  # built from values: it holds no part of this run
        self.last_step: tuple[Any, float | None] = (None, None)  # the last step's gradient norm and rate
        self.eval_stops_on_preemption = False  # True while the loop's own evaluation runs
        self.train_mode = TrainMode()  # model.train() (and a schedule-free optimizer's) per micro-batch
        self.zero_grad: Callable[[], None] = _nothing  # the optimizer's, bound in start()
        self._attached = contextlib.ExitStack()  # plug-ins' hooks on this run's module, off when it ends

    # -- set-up --------------------------------------------------------------------------------
    def start(
        self,
        optimizer: Any,
        state: TrainerState,
        attach: Callable[[nn.Module, TrainerState], contextlib.ExitStack],
        metric_scheduler: bool,
    ) -> None:
        """After the optimizer exists and a checkpoint (if any) is restored: the counters this call
        starts from, the loss window it continues, the plug-ins' hooks on the module it trains
        (`attach`: `plugins.around_run` of the Trainer's plug-ins), the complete plan."""
        cursor = self.position.cursor
        cursor.first_step_of_call = cursor.steps_applied
        self.start_counters = RunStart(
            samples=cursor.samples_seen, tokens=cursor.tokens_seen, input_tokens=state.num_input_tokens_seen
        )
        self.losses.continue_window()
        self.plan = dataclasses.replace(self.plan, metric_scheduler=metric_scheduler)
        self.train_mode = TrainMode(optimizer)
        self._attached = attach(self.engine.module, state)
        self.zero_grad = grads_to_none(optimizer)
        self.zero_grad()

    @property
    def cursor(self) -> Any:
        """The position's loop cursor (`Trainer.cursor`)."""
        return self.position.cursor

    @property
    def max_steps(self) -> int:
        return self.plan.max_steps

    @property
    def epochs(self) -> int:
        return self.plan.epochs

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """The loop's own evaluation runs: a preemption stops it at its next batch (`preempted`)."""
        self.eval_stops_on_preemption = True
        try:
            yield
        finally:
            self.eval_stops_on_preemption = False

    def at_step_boundary(self) -> bool:
        """Accelerate's `sync_gradients` (`Position.at_step_boundary`)."""
        return self.position.at_step_boundary()

    def evaluation_ran(self, completed: bool) -> None:
        """The loop's evaluation ended: completed, or cut short by a preemption (a resume runs it first)."""
        self.position.evaluation_pending = not completed

    def close(self) -> None:
        """The run is over: its model hooks come off, the batch in hand goes."""
        self._attached.close()
        self.position.look_ahead.drop()

    # -- one step ------------------------------------------------------------------------------
    def finish_step(
        self, applied: bool, grad_norm: Any, optimizer: Any, scheduler: Any, state: TrainerState
    ) -> None:
        """After the optimizer step: its gradient norm, the rate it applied, the schedule, zeroed
        gradients, counters (and TrainerState's, as `sync_state`, without a call)."""
        self.last_step = (grad_norm, optimizer.param_groups[0]["lr"])
        plan = self.plan
        if applied and not plan.metric_scheduler:
            scheduler.step()
        self.zero_grad()
        cursor = self.position.cursor
        cursor.steps_attempted += 1
        cursor.steps_applied += int(applied)
        cursor.steps_since_log += 1
        state.global_step = cursor.steps_applied
        state.optimizer_step_attempts = cursor.steps_attempted
        state.epoch = cursor.fractional_epoch
        state.total_flos = cursor.flops_seen * plan.data_world_size  # peers sharing a batch: once

    def sync_state(self, state: TrainerState) -> None:
        """TrainerState's counters, derived from the cursor."""
        cursor = self.position.cursor
        state.global_step = cursor.steps_applied
        state.optimizer_step_attempts = cursor.steps_attempted
        state.epoch = cursor.fractional_epoch
        state.total_flos = cursor.flops_seen * self.plan.data_world_size  # peers sharing a batch: once

    def preempted(self) -> bool:
        """Whether a preemption signal arrived (on any process: every process stops at the same step)."""
        return self.plan.agree(self.preemption.requested is not None)

    def stop_if_preempted(self, control: TrainerControl) -> None:
        if self.plan.agree(self.preemption.requested is not None):  # preempted(), without a call
            control.should_save = control.should_training_stop = True

    def log_due(self, control: TrainerControl) -> bool:
        """Whether `_maybe_log_save_evaluate` has anything to do after this step."""
        return (  # an overriding subclass sees every step, as upstream calls it every step
            self.plan.custom_lse
            or control.should_log
            or control.should_evaluate
            or control.should_save
            or self.position.cursor.steps_since_log >= MAX_UNLOGGED_STEPS  # window_full(), without a call
        )

    def window_full(self) -> bool:
        """Whether the unlogged step losses fill their bound (then they are folded into train_loss)."""
        return self.position.cursor.steps_since_log >= MAX_UNLOGGED_STEPS

    def end_epoch(self, epoch: int, steps: int, exhausted: bool, control: TrainerControl) -> None:
        """After an epoch's last step: refuse a run that never got a batch, stop at an iterable that
        ran dry, and move the cursor to the next epoch unless the run stopped inside this one."""
        position = self.position
        cursor = position.cursor
        if steps == 0 and cursor.batch_in_epoch == 0:
            if cursor.steps_attempted == 0:  # not one batch in the whole run: refuse, never "succeed"
                raise ValueError(
                    empty_training_message(position.dataloader, self.args, self.runtime.world_size)
                )
            logger.warning(  # as upstream: an iterable that ran dry before max_steps
                "Epoch %d produced no batch: stopping training at step %d of max_steps=%d.",
                epoch,
                cursor.steps_applied,
                self.plan.max_steps,
            )
            control.should_training_stop = True
        # A run stopped mid-epoch keeps its position there, so a resume continues the same epoch.
        done = cursor.steps_in_epoch > 0 and cursor.batch_in_epoch >= cursor.steps_in_epoch
        if exhausted or control.should_epoch_stop or done:
            position.next_epoch(epoch)

    # -- the end -------------------------------------------------------------------------------
    def samples_and_tokens_run(self) -> tuple[int, int]:
        """Samples and tokens this call trained on, over every data-parallel rank."""
        world, cursor, start = self.runtime.data_world_size, self.position.cursor, self.start_counters
        return (
            (cursor.samples_seen - start.samples) * world,
            (cursor.tokens_seen - start.tokens) * world,
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


def _nothing() -> None:
    return None

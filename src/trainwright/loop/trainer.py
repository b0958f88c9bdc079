"""Trainer: the transformers.Trainer API on a loop you can read top to bottom.

`train()` claims the output folder and builds a `TrainingRun` (loop/run/: engine, position, loss log,
preemption guard, checkpointer) in `_inner_training_loop`; `_run_epoch` is one optimizer step after
another: take the step's micro-batches and count their items, then per micro-batch forward and backward
under the engine's accumulation context (no gradient sync but on the last); clip, optimizer step,
schedule, counters; events; maybe log / evaluate / save."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any, cast

import torch
from torch import nn

from trainwright.args.accelerator_config import AcceleratorConfig
from trainwright.args.training_args import TrainingArguments
from trainwright.checkpoint.rng import capture_rng_state, restore_rng_state
from trainwright.core.nested import to_device
from trainwright.core.output_lock import claim_output_dir
from trainwright.core.seed import enable_full_determinism, set_seed
from trainwright.core.state import TrainerState
from trainwright.distributed import context_parallel
from trainwright.loop import batch_size_finder, plugins
from trainwright.loop.checkpoints import resume
from trainwright.loop.checkpoints.callback_states import callback_states
from trainwright.loop.checkpoints.checkpointer import OVERRIDABLE, Checkpointer
from trainwright.loop.eval import hooks as prediction
from trainwright.loop.hub import push as hub
from trainwright.loop.run.training_run import TrainingRun
from trainwright.loop.trainer_api import TrainerAPI
from trainwright.loop.trainer_setup import enable_activation_checkpointing
from trainwright.modeling import model_path
from trainwright.modeling.loss import items_in_batch, loss_honours_num_items
from trainwright.modeling.step_weights import StepWeights
from trainwright.observe import host
from trainwright.observe.metrics import TrainOutput, call_log, speed_metrics

logger = logging.getLogger(__name__)

_NO_CONTEXT = contextlib.nullcontext()  # reusable: nullcontext keeps no state


class Trainer(TrainerAPI):
    """Train, evaluate and predict with a PyTorch model; the API of ``transformers.Trainer``."""

    loss_is_scaled_for_ga: bool | None = None

    # ------------------------------------------------------------------ train
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> TrainOutput:
        """Run the training loop; `resume_from_checkpoint=True` takes the newest complete checkpoint."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        self._hp_search_setup(trial)
        self._sync_args()
        args = self.args
        self.is_in_train = True
        self._memory_tracker.start("train")
        if self.model_init is not None:  # a fresh model for each call (each search trial)
            if args.full_determinism:
                enable_full_determinism(args.seed)
            else:
                set_seed(args.seed)
            self.model = self.model_wrapped = self._place(self.call_model_init(trial))
            # label names, can_return_loss and the smoother stay __init__'s, as upstream
            self._loss_facts = self._model_loss_facts()
            self.optimizer, self.lr_scheduler = None, None
        if self._created_lr_scheduler:
            self.lr_scheduler = None  # a scheduler the Trainer made is re-made for each train()
        self._check_eval_dataset()
        resume_path = resume.resolve_resume_path(
            args, None if resume_from_checkpoint is False else resume_from_checkpoint
        )
        found, forget = self._train_batch_size, self._forget_failed_run  # auto_find_batch_size
        inner = batch_size_finder.inner_loop(
            self._inner_training_loop, args, found, self.runtime.device, forget, resume_path
        )
        lock = None
        try:
            # writable, and no other run writing it (a search trial: its run folder)
            lock = claim_output_dir(args, self.runtime, self._get_output_dir(trial))
            with plugins.around_train(self._plugins, self.model), hub.quiet_progress_bars(args.push_to_hub):
                try:
                    output = inner(
                        args=args,
                        resume_from_checkpoint=resume_path,
                        trial=trial,
                        ignore_keys_for_eval=ignore_keys_for_eval,
                    )
                finally:
                    # on an exception the write in flight finishes before the lock goes; the run's
                    # plug-ins come off before the call's
                    if self._run is not None:
                        self._run.checkpointer.abandon()
                        self._run.close()
            preempted = self._run.preemption.requested if self._run is not None else None
            if preempted is not None:
                logger.warning("Preempted by %s: checkpoint written, exiting.", preempted.name)
                raise SystemExit(0)
            return output
        finally:
            self.is_in_train = False
            self._hand_accelerator()  # the run's engine and batches are not the accelerator's to keep
            self._memory_tracker.stop("train")  # no-op when already stopped by a finished run
            if lock is not None:
                lock.release()

    def _inner_training_loop(
        self,
        batch_size: int | None = None,
        args: TrainingArguments | None = None,
        resume_from_checkpoint: str | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """Build the run (data, wrapping, optimizer, schedule, resume), then loop over epochs."""
        args = args if args is not None else self.args
        self._train_batch_size = batch_size or args.per_device_train_batch_size
        run = self._prepare_run(args, resume_from_checkpoint, trial, ignore_keys_for_eval)
        with run.preemption:  # SIGTERM & co: a checkpoint at the end of the step, then exit 0
            self._fire("on_train_begin")
            if args.eval_on_start and resume_from_checkpoint is None:
                self._determine_best_metric(
                    self._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True), trial
                )
            if (
                run.position.evaluation_pending and args.eval_strategy != "no"
            ):  # cut short by a preemption: now
                self._evaluate_during_training(run, trial, ignore_keys_for_eval)
                self.control.should_save = False  # this step's checkpoint is the one resumed
            for epoch in range(run.position.cursor.epoch, run.plan.epochs):
                if self.state.global_step >= run.plan.max_steps:
                    break
                self._run_epoch(run, epoch)
                if self.control.should_training_stop:
                    break
            return self._finalize_training(run)

    def _prepare_run(
        self, args: TrainingArguments, resume_path: str | None, trial: Any, ignore_keys_for_eval: Any
    ) -> TrainingRun:
        dataloader = self.get_train_dataloader()
        epochs, _, examples, _, _, steps_in_epoch, max_steps = self.set_initial_training_values(
            args, dataloader
        )
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            train_batch_size=args.per_device_train_batch_size,
            stateful_callbacks=callback_states(self.callback_handler, self.control),
        )
        self.state.is_hyper_param_search = trial is not None
        self.state.compute_steps(args, max_steps)
        self.state.init_training_references(self, max_steps, epochs, trial)  # upstream's call
        if trial is not None and self.hp_search_backend is not None:
            self.state.trial_name, self.state.trial_params = self._hp_trial_record(trial)
        if args.gradient_checkpointing:  # a dict or None since TrainingArguments.__post_init__
            enable_activation_checkpointing(
                self.model, cast("dict[str, Any] | None", args.gradient_checkpointing_kwargs)
            )
        exact_flops = self._wants_flops() or self._overrides("floating_point_ops")
        overridden = frozenset(hook for hook in OVERRIDABLE if self._overrides(hook))
        checkpointer = Checkpointer(args, self.runtime, self._get_output_dir(trial), resume_path, overridden)
        run = self._run = TrainingRun(
            args,
            self.runtime,
            self.model,
            dataloader,
            epochs=epochs,
            max_steps=max_steps,
            steps_in_epoch=steps_in_epoch,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            # an overridden floating_point_ops is called every micro-batch, as upstream
            count_flops=self.floating_point_ops if exact_flops else None,
            weights=self._step_weights,
            # called where a resumed epoch skips, as upstream
            resumed_loader=self.get_resumed_dataloader if self._overrides("get_resumed_dataloader") else None,
            custom_lse=self._overrides("_maybe_log_save_evaluate"),
            checkpointer=checkpointer,
        )
        self.model_wrapped = self._wrap_model(self.model)  # DDP / FSDP2 (DeepSpeed: in start)
        self.model_wrapped, self.optimizer = run.engine.start(self, max_steps, self.model_wrapped)
        self.scaler = run.engine.scaler  # fp16 grad scaler (DeepSpeed scales itself)
        self._hand_accelerator(run)
        if resume_path is not None:
            checkpointer.restore(resume_path, self, run)
        run.start(self.optimizer, self.state, self._plugins_on, self._scheduler_is_plateau())
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader, handler.cursor = dataloader, run.position.cursor
        logger.info(
            "***** Running training *****  examples/epoch=%s  epochs=%s  batch/device=%s  accumulation=%s  "
            "processes=%s  optimizer steps=%s  trainable parameters=%s  %s",
            examples if steps_in_epoch else "?",
            epochs,
            args.per_device_train_batch_size,
            args.gradient_accumulation_steps,
            self.runtime.world_size,
            max_steps,
            self.get_num_trainable_parameters(),
            host.threads_and_load(),
        )
        if self.runtime.device.type == "cpu" and self.runtime.is_local_main_process:
            busy = host.busy_warning()  # the start line is INFO, which a console does not show by default
            if busy is not None:
                logger.warning(busy)
        return run

    def _run_epoch(self, run: TrainingRun, epoch: int) -> None:
        """One epoch of optimizer steps (or what is left of it after a resume)."""
        args, state, position, engine = self.args, self.state, run.position, run.engine
        cursor, device, max_steps = position.cursor, self.runtime.device, run.plan.max_steps
        batches = position.epoch_batches(epoch)
        # the per-step calls, looked up once: CPython does not specialize a method lookup on an
        # object with as many attributes as the Trainer (~2.5% of a small model's step)
        fire, get_batch_samples, training_step = self._fire, self.get_batch_samples, self.training_step
        begin_step, advance, finish_step = position.begin_step, position.advance, run.finish_step
        add_loss, poll, log_due = run.losses.window.add, run.checkpointer.poll, run.log_due
        fire("on_epoch_begin")
        steps, exhausted = 0, False
        while True:
            micro_batches, num_items = get_batch_samples(batches, args.gradient_accumulation_steps, device)
            if not micro_batches:
                exhausted = True
                break
            steps += 1
            fire("on_step_begin")
            last = begin_step(micro_batches)
            for i, inputs in enumerate(micro_batches):
                advance(inputs, state)
                # no gradient sync but on the last micro-batch; context parallel trains on a shard
                with engine.accumulate(i < last, inputs) as inputs:
                    loss = training_step(self.model_wrapped, inputs, num_items)
                add_loss(cursor.steps_since_log, loss)
                if i < last:
                    fire("on_substep_end")
            del micro_batches
            grad_norm = engine.clip()
            fire("on_pre_optimizer_step")
            applied, grad_norm = engine.step(grad_norm)  # DeepSpeed reports the norm it clipped
            fire("on_optimizer_step")
            finish_step(applied, grad_norm, self.optimizer, self.lr_scheduler, state)
            fire("on_step_end")
            run.stop_if_preempted(self.control)
            if log_due(self.control):
                self._maybe_log_save_evaluate(*self._log_save_evaluate_args(run, epoch))
            poll()  # async_save: a durable checkpoint's rotation and on_save
            if self.control.should_epoch_stop or self.control.should_training_stop:
                break
            if state.global_step >= max_steps:
                self.control.should_training_stop = True
                break
        run.end_epoch(epoch, steps, exhausted, self.control)
        run.sync_state(state)
        fire("on_epoch_end")
        self._maybe_log_save_evaluate(*self._log_save_evaluate_args(run, epoch))

    def get_batch_samples(
        self, epoch_iterator: Any, num_batches: int, device: torch.device | None = None
    ) -> tuple[list, torch.Tensor | None]:
        """The next optimizer step's micro-batches (up to `num_batches`, on the CPU) and the items
        they hold over every process (None when the step is one micro-batch on one process)."""
        micro_batches = list(islice(epoch_iterator, num_batches))
        if not micro_batches:
            return micro_batches, None
        return micro_batches, self._weights().count(micro_batches, self._measure_loss_kwargs)

    def _weights(self) -> StepWeights:
        """The run's weighting of micro-batch losses (outside `train()`: one for this call)."""
        return self._run.weights if self._run is not None else self._step_weights()

    def _step_weights(self, on_empty: Callable[[], None] | None = None) -> StepWeights:
        """How a run weights its micro-batches' losses, from what it starts with (`StepWeights`)."""
        runtime = self.runtime
        return StepWeights(
            self._loss_facts,
            custom_loss=self.label_smoother is not None or self.compute_loss_func is not None,
            scaled_for_ga=self.loss_is_scaled_for_ga,
            runtime=runtime,
            across=runtime.distributed and self.args.average_tokens_across_devices,
            on_empty=on_empty,
        )

    def _measure_loss_kwargs(self, micro_batches: list, num_items: torch.Tensor) -> None:
        """Settle, once per run, whether a `**kwargs` forward really divides by `num_items_in_batch`
        (measured on a micro-batch with label targets: one without any says nothing)."""
        facts = self._loss_facts
        if self.compute_loss_func is not None or self.label_smoother is not None:
            facts.probe = False
            return  # the model is not given num_items_in_batch then
        inputs = next((b for b in micro_batches if _has_targets(b, facts.label_shift)), None)
        if inputs is None:
            if not any(
                isinstance(b, Mapping) and isinstance(b.get("labels"), torch.Tensor) for b in micro_batches
            ):
                facts.probe = False  # no labels at all: nothing to measure, ever
            return  # this step's labels are all ignored: measure on a later step
        facts.probe = False
        with self.compute_loss_context_manager():
            honoured = loss_honours_num_items(
                self.model, self._prepare_inputs(inputs), num_items.to(self.runtime.device)
            )
        if self.runtime.distributed:  # every process must take the same path
            honoured = not self.runtime.any_process(not honoured)
        if not honoured and self.runtime.parallel_size("cp") > 1:
            raise context_parallel.refuse_mean_loss(type(self.model).__name__)
        facts.accepts_loss_kwargs = honoured
        logger.info(
            "%s %s num_items_in_batch: %s.",
            type(self.model).__name__,
            "divides its loss by" if honoured else "ignores",
            "passing it" if honoured else "its mean loss is weighted by each micro-batch's share",
        )

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss that was backpropagated
        (weighted by its share of the step's items)."""
        run = self._run
        if run is not None:
            run.train_mode(model)
            weights = run.weights
        else:  # called outside train()
            model.train()
            weights = self._step_weights()
        if (
            num_items_in_batch is not None
            and num_items_in_batch.device.type == "cpu"
            and not num_items_in_batch
        ):
            return torch.zeros(
                (), device=self.runtime.device
            )  # no target in the whole step: nothing to learn
        share = weights.share(inputs, num_items_in_batch)  # a CPU count, before the batch moves
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        loss = weights.scale(loss, share, num_items_in_batch)
        if run is not None:  # DeepSpeed's, the fp16 scaler's, LOMO's fused backward, or plain
            run.engine.backward(loss)
        else:
            loss.backward()
        return loss.detach()

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | None = None,
    ):
        """The model's loss (or `compute_loss_func`'s, or label smoothing's) for one batch."""
        labels = None
        custom = self.label_smoother is not None or self.compute_loss_func is not None
        divided = False  # the loss is `sum / N` of the step's items on every process
        if custom and "labels" in inputs:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
            divided = num_items_in_batch is not None
        elif num_items_in_batch is not None and "labels" in inputs and self._loss_facts.accepts_loss_kwargs:
            # the model's own loss divides by the step's items (`StepWeights` reads the same facts)
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch.to(self.runtime.device)}
            divided = True
        # with padding_free / fused_linear_cross_entropy the model path's forward; else model(**inputs)
        outputs, labels = model_path.forward(self, model, inputs, labels, num_items_in_batch, return_outputs)
        if labels is not None:  # popped for compute_loss_func or the label smoother
            loss = self._custom_loss(outputs, labels, num_items_in_batch)
        elif isinstance(outputs, dict):
            if outputs.get("loss") is None:
                raise ValueError(
                    "The model did not return a loss from the inputs it got. It returned the keys "
                    f"{sorted(outputs.keys())}; the inputs had the keys {sorted(inputs.keys())}. "
                    "Pass `labels` (or set `label_names`) or compute the loss in `compute_loss_func`."
                )
            loss = outputs["loss"]
        else:
            loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        if divided:  # as upstream's compute_loss: times the processes DDP averages over
            loss = self._weights().across_processes(loss)
        return (loss, outputs) if return_outputs else loss

    def _custom_loss(
        self, outputs: Any, labels: torch.Tensor, num_items_in_batch: torch.Tensor | None
    ) -> Any:
        """`compute_loss_func`'s loss, else the label smoother's, of the outputs and popped labels."""
        if self.compute_loss_func is not None:
            return self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        assert self.label_smoother is not None  # labels were popped for it
        return self.label_smoother(
            outputs, labels, shift_labels=self._loss_facts.label_shift, num_items_in_batch=num_items_in_batch
        )

    # ------------------------------------------------------------------ the step's hooks (called per micro-batch or per step)
    def _prepare_inputs(self, inputs: Any) -> Any:
        """The batch on this process's device (as made: on the CPU, when that is the device)."""
        if self.runtime.device.type == "cpu":
            return inputs
        return self._prepare_input(inputs)

    def _prepare_input(self, data: Any) -> Any:
        """`data` on this process's device: the tensors in it, through mappings, lists and tuples."""
        device = self.runtime.device
        # accelerator_config: an AcceleratorConfig after TrainingArguments.__post_init__
        non_blocking = (
            device.type == "cuda" and cast(AcceleratorConfig, self.args.accelerator_config).non_blocking
        )
        return to_device(data, device, non_blocking)

    def _amp_dtype(self, evaluating: bool = False) -> torch.dtype | None:
        if evaluating and (self.args.bf16_full_eval or self.args.fp16_full_eval):
            return None  # the model itself is cast
        if self.args.bf16:
            return torch.bfloat16
        if self.args.fp16:
            return torch.float16
        return None

    def compute_loss_context_manager(self) -> contextlib.AbstractContextManager:
        """The context of every forward that computes a loss (training and prediction steps)."""
        return self.autocast_smart_context_manager()

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """Autocast to bf16/fp16 when mixed precision is on (not over a model cast for full eval)."""
        if not (self.args.bf16 or self.args.fp16):
            return _NO_CONTEXT  # the common case, on every micro-batch: decided without a call
        dtype = self._amp_dtype(evaluating=not self.model.training)
        if dtype is None:
            return _NO_CONTEXT
        return self.runtime.autocast(dtype, cache_enabled=cache_enabled)

    def _fire(self, event: str, state: TrainerState | None = None, extra: dict | None = None) -> None:
        """Send `event` (with `extra` keyword arguments) to the callbacks that listen to it;
        `control` is what they return."""
        handler = self.callback_handler
        if event in handler.quiet:  # nobody listens, nothing to reset: no call (every step's events)
            return
        self.control = handler.dispatch(event, self.args, state or self.state, self.control, extra)

    def _log_save_evaluate_args(self, run: TrainingRun, epoch: int) -> tuple:
        """`_maybe_log_save_evaluate`'s arguments, in upstream's order."""
        # tr_loss is only materialised for a subclass that overrides the method (it costs a stack)
        plan, (grad_norm, last_lr) = run.plan, run.last_step
        tr_loss = run.losses.window_sum() if plan.custom_lse else None
        return (
            tr_loss,
            grad_norm,
            self.model_wrapped,
            plan.trial,
            epoch,
            plan.ignore_keys_for_eval,
            run.start_counters.time,
            last_lr,
        )

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Record a row in log_history and send it to every callback's `on_log`."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if (
                start_time is not None and self._run is not None
            ):  # v5: this call's tokens over its time so far
                tokens = self.state.num_input_tokens_seen - self._run.start_counters.input_tokens
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self._fire("on_pre_log", extra={"logs": logs})
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self._fire("on_log", extra={"logs": logs})

    def _log_training_window(
        self, grad_norm: Any = None, learning_rate: float | None = None, start_time: float | None = None
    ) -> None:
        logs = self._training_window_row(grad_norm, learning_rate)
        call_log(self.log, logs, start_time)  # also an override with the older log(self, logs)

    def _training_window_row(
        self, grad_norm: Any = None, learning_rate: float | None = None
    ) -> dict[str, float]:
        assert self._run is not None  # training windows are read while a run trains
        return self._run.losses.window_row(self.state.global_step, grad_norm, learning_rate)

    def _fold_loss_window(self) -> None:
        assert self._run is not None
        self._run.losses.read(self.state.global_step)

    # ------------------------------------------------------------------ log / evaluate / save
    def _maybe_log_save_evaluate(
        self,
        tr_loss: torch.Tensor | None,
        grad_norm: torch.Tensor | float | None,
        model: nn.Module,
        trial: Any,
        epoch: float,
        ignore_keys_for_eval: list[str] | None,
        start_time: float,
        learning_rate: float | None = None,
    ) -> None:
        """Log the training window, evaluate and save when `control` says so (upstream's signature;
        the window's losses are read from the run's loss window, `tr_loss` is informative)."""
        run = self._run
        assert run is not None  # called by the loop
        if self.control.should_log and run.position.cursor.steps_since_log > 0:
            self._log_training_window(grad_norm, learning_rate, start_time)
        elif run.window_full():
            self._fold_loss_window()  # bounded window and data_state.json without logging
        if self.control.should_evaluate:
            self._evaluate_during_training(run, trial, ignore_keys_for_eval)
        if self.control.should_save and run.checkpointer.wrote(self.state.global_step):
            self.control.should_save = False  # written at this step already (a preempted epoch's end)
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            run.checkpointer.saved(self.control, self._fire)  # on_save now, or once a write is durable

    def _evaluate_during_training(self, run: TrainingRun, trial: Any, ignore_keys_for_eval: Any) -> None:
        rng = capture_rng_state()  # what a checkpoint holds if a preemption cuts the evaluation short
        metrics, cut_short = None, False
        try:
            with run.evaluating():  # a preemption stops it at its next batch
                metrics = self._evaluate(trial, ignore_keys_for_eval)
        except prediction.EvaluationPreempted as stopped:
            # As if it never started: the random streams it drew from go back, and the resumed run
            # runs it first, so the resume stays exact and no metric is lost.
            restore_rng_state(rng)
            cut_short, self.control.should_evaluate = True, False
            logger.warning(
                "%s: no evaluation metrics for step %d yet; a resume evaluates it first.",
                stopped,
                self.state.global_step,
            )
        run.evaluation_ran(completed=not cut_short)
        if metrics is not None:
            is_new_best = self._determine_best_metric(metrics=metrics, trial=trial)
            if self.args.save_strategy == "best":
                self.control.should_save = is_new_best
        run.stop_if_preempted(self.control)  # arrived during the evaluation: save and stop all the same

    def _save_checkpoint(self, model: nn.Module | None = None, trial: Any = None) -> None:
        assert self._run is not None  # checkpoints are saved while a run trains
        path = self._run.checkpointer.save(self, self._run, self._fire)
        if path is not None and self.args.push_to_hub:  # None: written in the background, pushed when durable
            self._push_from_checkpoint(path)

    def _overrides(self, name: str) -> bool:
        """Whether a subclass overrides the Trainer method `name` (then it is called as upstream does)."""
        return getattr(type(self), name) is not getattr(Trainer, name)

    def _finalize_training(self, run: TrainingRun) -> TrainOutput:
        cursor, args = run.position.cursor, self.args
        run.checkpointer.wait()  # the last checkpoint durable (its on_save fired) before the best loads
        window: dict[str, float] = {}
        if cursor.steps_since_log > 0 and args.logging_strategy != "no":
            # the last steps' loss, seen in the final row (a row of its own would be one without the
            # evaluation keys among the evaluation rows, which upstream's callers do not expect)
            window = self._training_window_row(*run.last_step)
        elif cursor.steps_since_log > 0:  # unlogged steps still count in train_loss
            self._fold_loss_window()
        train_loss = run.losses.train_loss()
        samples_run, tokens_run = run.samples_and_tokens_run()
        metrics = speed_metrics(
            "train",
            run.start_counters.time,
            num_samples=samples_run,
            num_steps=cursor.steps_applied - cursor.first_step_of_call,
            num_tokens=tokens_run if args.include_tokens_per_second else None,  # v4
        )
        self.store_flos()
        metrics["total_flos"] = self.state.total_flos
        metrics["train_loss"] = train_loss
        self._memory_tracker.stop_and_update_metrics("train", metrics)
        row = {**window, **metrics}
        self.log(row)
        # what log added to the row (epoch) is in the returned metrics too, as upstream's
        metrics.update((k, v) for k, v in row.items() if k not in window)
        if args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._load_best_model()
        run.checkpointer.keep_only_best(self.state, run.losses.divergence)
        run.losses.divergence.say()
        self._fire("on_train_end")
        self._finish_current_push()  # the last checkpoint's upload is done when train() returns
        return TrainOutput(self.state.global_step, train_loss, metrics)


def _has_targets(batch: Any, label_shift: bool) -> bool:
    """Whether a batch has labels with at least one target (a CPU count, no device sync)."""
    if not isinstance(batch, Mapping) or not isinstance(batch.get("labels"), torch.Tensor):
        return False
    return bool(items_in_batch(batch, label_shift))

"""Trainer: the transformers.Trainer API on a loop you can read top to bottom.

`train()` claims the output folder and builds a `TrainingRun` (run.py: engine, cursor, loss window,
preemption guard, checkpointer) in `_inner_training_loop`; `_run_epoch` is one optimizer step after
another: take the step's micro-batches and count their items, then per micro-batch forward and
backward under the engine's accumulation context (no gradient sync but on the last); clip, optimizer
step, schedule, counters; events; maybe log / evaluate / save.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from itertools import islice
from typing import Any, cast

import torch
from torch import nn

from trainwright.args.training_args import TrainingArguments
from trainwright.checkpoint.rng import capture_rng_state, restore_rng_state
from trainwright.checkpoint.weights import check_load_result
from trainwright.core.output_lock import claim_output_dir
from trainwright.core.seed import enable_full_determinism, set_seed
from trainwright.core.state import TrainerState
from trainwright.distributed.engine import load_weights
from trainwright.loop import batch_size_finder, plugins, resume
from trainwright.loop.checkpoint_parts import callback_states, write_model
from trainwright.loop.checkpointer import Checkpointer, load_rng_state, run_dir
from trainwright.loop.eval import hooks as prediction
from trainwright.loop.hub import push as hub
from trainwright.loop.run import TrainingRun
from trainwright.loop.trainer_api import TrainerAPI
from trainwright.loop.trainer_setup import enable_activation_checkpointing
from trainwright.modeling import model_path
from trainwright.modeling.step_weights import StepWeights
from trainwright.observe import host
from trainwright.observe.metrics import TrainOutput, speed_metrics

logger = logging.getLogger(__name__)


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
        if self._created_scheduler:
            self.lr_scheduler = None  # a scheduler the Trainer made is re-made for each train()
        self._check_eval_dataset()
        resume_path = resume.resolve_resume_path(
            args, None if resume_from_checkpoint is False else resume_from_checkpoint
        )
        inner_training_loop = batch_size_finder.inner_loop(self, resume_path)  # auto_find_batch_size
        lock = None
        try:
            # writable, and no other run writing it (a search trial: its run folder)
            lock = claim_output_dir(self, self._get_output_dir(trial))
            with plugins.around_train(self._plugins, self.model), hub.quiet_progress_bars(args.push_to_hub):
                try:
                    output = inner_training_loop(
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
            if run.evaluation_pending and args.eval_strategy != "no":  # cut short by a preemption: now
                self._evaluate_during_training(run, trial, ignore_keys_for_eval)
                self.control.should_save = False  # this step's checkpoint is the one resumed
            for epoch in range(run.cursor.epoch, run.epochs):
                if self.state.global_step >= run.max_steps:
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
        self.state.init_training_references(self, max_steps, epochs, trial)
        if args.gradient_checkpointing:  # a dict or None since TrainingArguments.__post_init__
            enable_activation_checkpointing(
                self.model, cast("dict[str, Any] | None", args.gradient_checkpointing_kwargs)
            )
        exact_flops = self._wants_flops() or self._overrides("floating_point_ops")
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
        )
        run.checkpointer = Checkpointer(self, run, resume_from=resume_path)
        self.model_wrapped = self._wrap_model(self.model)  # DDP / FSDP2 (DeepSpeed: in start)
        self.model_wrapped, self.optimizer = run.engine.start(self, max_steps, self.model_wrapped)
        self.scaler = run.engine.scaler  # fp16 grad scaler (DeepSpeed scales itself)
        if resume_path is not None:
            run.checkpointer.restore(resume_path)
        run.start(
            self.optimizer,
            self.state,
            self._plugins,
            self._scheduler_is_plateau(),
            self._overrides("_maybe_log_save_evaluate"),
        )
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader, handler.cursor = dataloader, run.cursor
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
        args, state, cursor, engine = self.args, self.state, run.cursor, run.engine
        batches = run.epoch_batches(epoch)
        # the per-step calls, looked up once: CPython does not specialize a method lookup on an
        # object with as many attributes as the Trainer or the run (~2.5% of a small model's step)
        fire, get_batch_samples, training_step = self._fire, self.get_batch_samples, self.training_step
        begin_step, advance, finish_step = run.begin_step, run.advance, run.finish_step
        fire("on_epoch_begin")
        steps, exhausted = 0, False
        while True:
            micro_batches, num_items = get_batch_samples(
                batches, args.gradient_accumulation_steps, run.device
            )
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
                run.losses.add(cursor.steps_since_log, loss)
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
            if run.log_due(self.control):
                self._maybe_log_save_evaluate(*self._log_save_evaluate_args(run, epoch))
            run.checkpointer.poll()  # async_save: a durable checkpoint's rotation and on_save
            if self.control.should_epoch_stop or self.control.should_training_stop:
                break
            if state.global_step >= run.max_steps:
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
        return micro_batches, self._weights().count(micro_batches) if micro_batches else None

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
            probe=self._measure_loss_kwargs,
            on_empty=on_empty,
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
        if self.control.should_log and run.cursor.steps_since_log > 0:
            self._log_training_window(grad_norm, learning_rate, start_time)
        elif run.window_full():
            self._fold_loss_window()  # bounded window and data_state.json without logging
        if self.control.should_evaluate:
            self._evaluate_during_training(run, trial, ignore_keys_for_eval)
        if self.control.should_save and run.checkpointer.wrote(self.state.global_step):
            self.control.should_save = False  # written at this step already (a preempted epoch's end)
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            run.checkpointer.saved()  # on_save now, or once a background write is durable

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

    def _get_output_dir(self, trial: Any) -> str:
        """Where this run's checkpoints go: output_dir, or a search trial's folder in it (upstream's
        hook: a subclass's override moves them; TRL's GRPO writes files of its own there)."""
        return run_dir(self, trial)

    def _save_checkpoint(self, model: nn.Module | None = None, trial: Any = None) -> None:
        assert self._run is not None  # checkpoints are saved while a run trains
        path = self._run.checkpointer.save()
        if path is not None and self.args.push_to_hub:  # None: written in the background, pushed when durable
            self._push_from_checkpoint(path)

    def wait_for_checkpoint(self) -> None:
        """With `async_save`: block until the checkpoint being written in the background is durable
        (in place, rotated, `on_save` called); returns at once when none is. Raises the write's error."""
        if self._run is not None:
            self._run.checkpointer.wait()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the model (safetensors), the processing class and training_args.json.

        Every process calls it (a sharded model is gathered first); the writing process calls
        `_save`. Checkpoints write their weights through it too (`_internal_call=True`)."""
        output_dir = output_dir or self.args.output_dir
        assert output_dir is not None  # TrainingArguments.__post_init__ fills output_dir in
        run, args, runtime = self._run, self.args, self.runtime
        if run is not None:
            run.checkpointer.wait()  # a checkpoint being written in the background is finished first
        state_dict = run.engine.full_state_dict(on_every_rank=args.save_on_each_node) if run else None
        if runtime.is_main_process or (args.save_on_each_node and runtime.is_local_main_process):
            self._save(output_dir, state_dict=state_dict)
        runtime.barrier()
        if args.push_to_hub and not _internal_call:  # documented: a user's save_model pushes
            self.push_to_hub(commit_message="Model save", revision=args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write weights (`state_dict`, else the model's), processing class and training_args.json."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        assert output_dir is not None  # TrainingArguments.__post_init__ fills output_dir in
        os.makedirs(output_dir, exist_ok=True)
        write_model(self, output_dir, state_dict=state_dict)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Load a checkpoint's weights into `model` (default: the Trainer's)."""
        load_weights(model if model is not None else self.model, resume_from_checkpoint)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """What a subclass's `_load_from_checkpoint` calls on its `load_state_dict(strict=False)`
        result (GLiNER's): keys the model leaves out of its saves are tied again, as upstream; any
        other missing or unexpected key is an error naming them, where upstream warns and trains on."""
        check_load_result(self.model, load_result)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Load the optimizer's and the schedule's state of checkpoint `checkpoint` (None: nothing).
        Upstream's hook: a subclass's override is called at a resume, after the weights and the rest
        of the checkpoint; its super() call loads these two (TRL's GRPO then reads its entropy
        controller's file), without it they start anew."""
        if checkpoint is None:
            return
        if self._run is None:
            raise RuntimeError(
                "_load_optimizer_and_scheduler loads into a training run: call it from train() (a "
                "subclass's override is called there), or resume with train(resume_from_checkpoint=...)."
            )
        self._run.checkpointer.load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Restore this process's random generators from a checkpoint folder (a missing file warns,
        a damaged one is an error)."""
        if checkpoint is not None:
            load_rng_state(self.args, self.runtime, checkpoint)

    def _load_best_model(self) -> None:
        """Load the weights of `state.best_model_checkpoint` (load_best_model_at_end)."""
        if self._run is not None:  # called directly mid-training too: the checkpoint being written first
            self._run.checkpointer.wait()
        best = self.state.best_model_checkpoint
        logger.info("Loading the best model from %s (score: %s).", best, self.state.best_metric)
        assert best is not None  # called only when there is a best checkpoint
        self._load_from_checkpoint(best)

    def _forget_failed_run(self) -> None:
        """auto_find_batch_size: drop what a try that ran out of memory left (its run, the wrapper,
        the gradients, a Trainer-made schedule for the old number of steps)."""
        run = self._run
        if run is not None and run.cursor.steps_applied > run.cursor.first_step_of_call:
            logger.warning(
                "auto_find_batch_size: the out-of-memory error came after %d optimizer steps; the retry "
                "starts from the weights and optimizer state they left (as transformers does).",
                run.cursor.steps_applied - run.cursor.first_step_of_call,
            )
        if run is not None:
            run.checkpointer.abandon()
            run.close()
        self._run = None
        self.model_wrapped = self.model  # the failed try's wrapper (DDP buckets, compile) goes
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self._created_scheduler:
            self.lr_scheduler = None  # re-made for the new number of steps

    def _overrides(self, name: str) -> bool:
        """Whether a subclass overrides the Trainer method `name` (then it is called as upstream does)."""
        return getattr(type(self), name) is not getattr(Trainer, name)

    def _finalize_training(self, run: TrainingRun) -> TrainOutput:
        cursor, args = run.cursor, self.args
        run.checkpointer.wait()  # the last checkpoint durable (its on_save fired) before the best loads
        window: dict[str, float] = {}
        if cursor.steps_since_log > 0 and args.logging_strategy != "no":
            # the last steps' loss, seen in the final row (a row of its own would be one without the
            # evaluation keys among the evaluation rows, which upstream's callers do not expect)
            window = self._training_window_row(run.grad_norm, run.last_lr)
        elif cursor.steps_since_log > 0:  # unlogged steps still count in train_loss
            self._fold_loss_window()
        train_loss = run.train_loss()
        samples_run, tokens_run = run.samples_and_tokens_run()
        metrics = speed_metrics(
            "train",
            run.start_time,
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
        run.checkpointer.keep_only_best()
        run.divergence.say()
        self._fire("on_train_end")
        self._finish_current_push()  # the last checkpoint's upload is done when train() returns
        return TrainOutput(self.state.global_step, train_loss, metrics)

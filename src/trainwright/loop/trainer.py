"""Trainer: the transformers.Trainer API on a loop you can read top to bottom.

One training step (``_run_epoch``): fetch the step's micro-batches, count their items, then per
micro-batch forward under autocast + backward (no gradient sync but on the last); clip, optimizer
step, scheduler step, zero grad; advance the cursor; fire events; maybe log / evaluate / save.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from itertools import islice
from typing import Any, cast

import torch
from torch import nn

from trainwright import data as data_utils
from trainwright.args.training_args import TrainingArguments
from trainwright.checkpoint.output_lock import claim_output_dir
from trainwright.core.seed import set_seed
from trainwright.core.state import LoopCursor, TrainerState
from trainwright.distributed import device_cache
from trainwright.distributed.engine import build_engine
from trainwright.distributed.preemption import PreemptionGuard
from trainwright.loop import async_saves, batch_size_finder, hub, prediction, resume
from trainwright.loop import checkpointing as training_checkpoint
from trainwright.loop.trainer_api import TrainerAPI
from trainwright.loop.trainer_setup import enable_activation_checkpointing
from trainwright.modeling import model_path
from trainwright.modeling.loss import (
    LossWindow,
    batch_size,
    items_in_batch,
)
from trainwright.modeling.past_state import PastState
from trainwright.observe.flops import non_embedding_parameters
from trainwright.observe.metrics import (
    TrainOutput,
    speed_metrics,
)

logger = logging.getLogger(__name__)

_MAX_UNLOGGED_STEPS = 4096  # step losses kept for the next log row before they are folded into train_loss


_EvaluationPreempted = prediction.EvaluationPreempted


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
        if resume_from_checkpoint is False:
            resume_from_checkpoint = None
        self.is_in_train = True
        self._memory_tracker.start("train")
        args = self.args
        self._trial = trial
        if self.model_init is not None:
            set_seed(args.seed)
            self.model = self._place(self.call_model_init(trial))
            self.model_wrapped = self.model
            self._configure_model_facts()
            self.optimizer, self.lr_scheduler = None, None
        if getattr(self, "_created_scheduler", False):
            self.lr_scheduler = None  # a scheduler the Trainer made is re-made for each train()
        if args.eval_strategy != "no" and self.eval_dataset is None:
            raise ValueError(
                f"eval_strategy={args.eval_strategy.value if hasattr(args.eval_strategy, 'value') else args.eval_strategy!r}"
                " needs an eval_dataset: pass one to the Trainer or set eval_strategy='no'."
            )
        resume_path = resume.resolve_resume_path(self, resume_from_checkpoint)
        inner_training_loop = batch_size_finder.inner_loop(self, resume_path)  # auto_find_batch_size
        lock = None
        try:
            # writable, and no other run writing it (a search trial: its run folder)
            lock = claim_output_dir(self, training_checkpoint.run_dir(self))
            self._start_train_hooks()  # inside the try: a refused hook still ends the call cleanly
            with (
                PreemptionGuard(args.preemption_signals) as self._preemption,
                hub.quiet_progress_bars(args.push_to_hub),
            ):
                output = inner_training_loop(
                    args=args,
                    resume_from_checkpoint=resume_path,
                    trial=trial,
                    ignore_keys_for_eval=ignore_keys_for_eval,
                )
            if self._preemption.requested is not None:
                logger.warning(
                    "Preempted by %s: checkpoint written, exiting.", self._preemption.requested.name
                )
                raise SystemExit(0)
            return output
        finally:
            async_saves.abandon(self)  # on an exception: the write in flight finishes before the lock goes
            if self._neftune_hook is not None:  # NEFTune perturbs this call's training only
                self._neftune_hook.remove()
                self._neftune_hook = None
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
        """Set up the run (data, wrapping, optimizer, schedule, resume), then loop over epochs."""
        args = args if args is not None else self.args
        runtime, resume_path = self.runtime, resume_from_checkpoint
        train_dataloader = self.get_train_dataloader()
        num_train_epochs, _, num_examples, _, _, steps_in_epoch, max_steps = self.set_initial_training_values(
            args, train_dataloader
        )
        self._epoch_geometry = data_utils.sampler_geometry(train_dataloader)

        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            train_batch_size=args.per_device_train_batch_size,
            stateful_callbacks=training_checkpoint.callback_states(self),
        )
        self.state.is_hyper_param_search = trial is not None
        self.state.compute_steps(args, max_steps)
        self.state.init_training_references(self, max_steps, num_train_epochs, trial)
        self.cursor = LoopCursor(steps_in_epoch=steps_in_epoch)

        if args.gradient_checkpointing:
            # a dict or None since TrainingArguments.__post_init__
            enable_activation_checkpointing(
                self.model, cast("dict[str, Any] | None", args.gradient_checkpointing_kwargs)
            )
        self.model_wrapped = self._wrap_model(self.model)
        engine = build_engine(args, runtime, self.model, self.model_wrapped)  # plain/DDP, FSDP2, DeepSpeed
        if engine.owns_optimizer:  # DeepSpeed: its engine wraps the model and our (or its config's) optimizer
            self.model_wrapped, self.optimizer = engine.start(self.optimizer, self.create_optimizer)
            self.create_scheduler(max_steps, self.optimizer)
        else:  # after wrapping: FSDP2 replaces the parameters with sharded ones
            self.create_optimizer_and_scheduler(num_training_steps=max_steps)
        if args.torch_compile:
            assert args.torch_compile_backend is not None  # __post_init__ sets "inductor" with torch_compile
            # torch.compile of a module returns a module (OptimizedModule); torch types it as any callable
            self.model_wrapped = cast(
                nn.Module,
                torch.compile(
                    self.model_wrapped, backend=args.torch_compile_backend, mode=args.torch_compile_mode
                ),
            )
        if self.optimizer is None:
            raise RuntimeError("create_optimizer_and_scheduler() did not create Trainer.optimizer.")
        engine.attach(self.model_wrapped, self.optimizer)
        self._engine, self.scaler = engine, engine.scaler  # fp16 grad scaler (DeepSpeed scales itself)
        if resume_path is not None:
            self._iterable_restored = training_checkpoint.restore(self, resume_path, train_dataloader)
        self._plateau = self._scheduler_is_plateau()  # checked once, not every step
        self.cursor.first_step_of_call = self.cursor.steps_applied
        self._samples_at_start = self.cursor.samples_seen
        self._tokens_at_start = self.cursor.tokens_seen
        self._input_tokens_seen_at_start = self.state.num_input_tokens_seen
        self._empty_cache = (
            device_cache.EmptyCacheEvery(args.torch_empty_cache_steps, runtime.device)
            if args.torch_empty_cache_steps
            else None
        )
        self._past_state = PastState(args.past_index) if args.past_index >= 0 else None

        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader, handler.cursor = train_dataloader, self.cursor
        self._losses = LossWindow(runtime.device)
        self._losses.load(self.cursor.loss_window)
        self._grad_norm = None
        self._last_lr = None
        self._custom_lse = self._overrides("_maybe_log_save_evaluate")
        self._plain_forward = not (
            args.bf16
            or args.fp16
            or self._overrides("compute_loss_context_manager")
            or self._overrides("autocast_smart_context_manager")
        )
        # an overridden floating_point_ops is called every micro-batch, as upstream
        self._log_flops_and_tokens = self._wants_flops() or self._overrides("floating_point_ops")
        self._flops_per_token = 6 * non_embedding_parameters(self.model)
        logger.info(
            "***** Running training *****  examples/epoch=%s  epochs=%s  batch/device=%s  accumulation=%s  "
            "processes=%s  optimizer steps=%s  trainable parameters=%s",
            num_examples if steps_in_epoch else "?",
            num_train_epochs,
            args.per_device_train_batch_size,
            args.gradient_accumulation_steps,
            runtime.world_size,
            max_steps,
            self.get_num_trainable_parameters(),
        )
        self.optimizer.zero_grad(set_to_none=True)
        start_time = self._start_time = time.time()
        self.control = handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start and resume_path is None:
            self._determine_best_metric(
                self._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True), trial
            )

        for epoch in range(self.cursor.epoch, num_train_epochs):
            if self.state.global_step >= max_steps:
                break
            self._run_epoch(train_dataloader, epoch, max_steps, trial, ignore_keys_for_eval)
            if self.control.should_training_stop:
                break
        return self._finalize_training(start_time)

    def _run_epoch(self, dataloader, epoch: int, max_steps: int, trial, ignore_keys_for_eval) -> None:
        args, cursor, handler = self.args, self.cursor, self.callback_handler
        assert self.optimizer is not None  # created by _inner_training_loop before the first epoch
        ga = args.gradient_accumulation_steps
        assert self._engine is not None  # set up by _inner_training_loop
        accumulate, clip, step = self._engine.accumulate, self._engine.clip, self._engine.step
        plain_boundary = self._engine.plain_boundary
        # looked up once an epoch, not every step: nothing swaps these while an epoch runs
        optimizer, add_loss, device = self.optimizer, self._losses.add, self.runtime.device
        batches = self._epoch_batches(dataloader, epoch)
        if self._past_state is not None:  # past_index: the memory starts empty each epoch (v4)
            self._past_state.reset()
        self.control = handler.on_epoch_begin(args, self.state, self.control)
        ran_any = exhausted = False
        while True:
            micro_batches, num_items = self.get_batch_samples(batches, ga, device)
            if not micro_batches:
                exhausted = True
                break
            ran_any = True
            if self._probe_loss_kwargs and num_items is not None:
                self._measure_loss_kwargs(micro_batches, num_items)
            self.control = handler.on_step_begin(args, self.state, self.control)
            last = len(micro_batches) - 1
            for i, inputs in enumerate(micro_batches):
                self._advance_cursor(inputs)
                if i == last and plain_boundary:  # nothing to tell the engine: no context (~1 us)
                    step_loss = self.training_step(self.model_wrapped, inputs, num_items)
                else:
                    with accumulate(i < last):  # no gradient sync but on the last micro-batch
                        step_loss = self.training_step(self.model_wrapped, inputs, num_items)
                add_loss(cursor.steps_since_log, step_loss)
                if i < last:
                    self.control = handler.on_substep_end(args, self.state, self.control)
            del micro_batches
            self._grad_norm = clip()
            self.control = handler.on_pre_optimizer_step(args, self.state, self.control)
            applied, self._grad_norm = step(self._grad_norm)  # DeepSpeed reports the norm it clipped
            self.control = handler.on_optimizer_step(args, self.state, self.control)
            self._last_lr = optimizer.param_groups[0]["lr"]  # the rate this step applied
            if applied and not self._plateau:
                self.lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            cursor.steps_attempted += 1
            cursor.steps_applied += int(applied)
            cursor.steps_since_log += 1
            self._sync_state()
            self.control = handler.on_step_end(args, self.state, self.control)
            control = self.control
            if self._preempted():
                control.should_save = control.should_training_stop = True
            if (  # an overriding subclass sees every step, as upstream calls it every step
                self._custom_lse
                or control.should_log
                or control.should_evaluate
                or control.should_save
                or cursor.steps_since_log >= _MAX_UNLOGGED_STEPS
            ):
                self._maybe_log_save_evaluate(
                    *self._log_save_evaluate_args(trial, epoch, ignore_keys_for_eval)
                )
            if self._checkpoint_writer is not None:  # async_save: a durable checkpoint's rotation, on_save
                async_saves.poll(self)
            if self.control.should_epoch_stop or self.control.should_training_stop:
                break
            if self.state.global_step >= max_steps:
                self.control.should_training_stop = True
                break
        if not ran_any and cursor.batch_in_epoch == 0:
            if cursor.steps_attempted == 0:  # not one batch in the whole run: refuse, never "succeed"
                raise ValueError(self._empty_training_message(dataloader))
            logger.warning(  # as upstream: an iterable that ran dry before max_steps
                "Epoch %d produced no batch: stopping training at step %d of max_steps=%d.",
                epoch,
                self.state.global_step,
                max_steps,
            )
            self.control.should_training_stop = True
        # A run stopped mid-epoch keeps its position there, so a resume continues the same epoch.
        if exhausted or self.control.should_epoch_stop or _epoch_done(cursor):
            cursor.epoch, cursor.batch_in_epoch, cursor.samples_in_epoch = epoch + 1, 0, 0
        self._sync_state()
        self.control = handler.on_epoch_end(args, self.state, self.control)
        self._maybe_log_save_evaluate(*self._log_save_evaluate_args(trial, epoch, ignore_keys_for_eval))

    def _epoch_batches(self, dataloader, epoch: int):
        """This epoch's batches, starting after those a resumed run already consumed."""
        sampler: Any = getattr(dataloader, "sampler", None)
        dataset = getattr(dataloader, "dataset", None)
        obj: Any
        for obj in (dataloader, sampler, getattr(dataloader, "batch_sampler", None), dataset):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)
        done = self.cursor.samples_in_epoch
        if hasattr(sampler, "set_start"):
            sampler.set_start(done)
            return iter(dataloader)
        skip = 0 if self._iterable_restored else self.cursor.batch_in_epoch
        self._iterable_restored = False
        return data_utils.skip_iterable(dataloader, skip) if skip else iter(dataloader)

    def _preempted(self) -> bool:
        guard = self._preemption
        requested = guard is not None and guard.requested is not None
        return self.runtime.any_process(requested) if self.runtime.distributed else requested

    def get_batch_samples(
        self, epoch_iterator: Any, num_batches: int, device: torch.device | None = None
    ) -> tuple[list, torch.Tensor | None]:
        """The next optimizer step's micro-batches (up to `num_batches`, on the CPU) and the items
        they hold over every process (None when the step is one micro-batch on one process)."""
        micro_batches = list(islice(epoch_iterator, num_batches))
        return micro_batches, self._items_in_step(micro_batches) if micro_batches else None

    def _items_in_step(self, micro_batches: list) -> torch.Tensor | None:
        """Items (label targets, else samples) in this optimizer step over every process; None when
        the step is one micro-batch on one process, where no reweighting is needed."""
        distributed = self.runtime.distributed and self.args.average_tokens_across_devices
        if len(micro_batches) == 1 and not distributed:
            return None
        # a tensor: micro_batches is not empty (sum's type also allows its start, 0)
        total = cast(torch.Tensor, sum(items_in_batch(b, self._label_shift) for b in micro_batches))
        if distributed:
            total = self.runtime.all_reduce(total.to(self.runtime.device))
        return total

    def _advance_cursor(self, inputs: Any) -> None:
        cursor = self.cursor
        geometry = self._epoch_geometry  # batches cut in order from a sampler: sizes known exactly
        n = min(geometry[0], geometry[1] - cursor.samples_in_epoch) if geometry else batch_size(inputs)
        cursor.batch_in_epoch += 1
        cursor.samples_in_epoch += n
        cursor.samples_seen += n
        is_mapping = type(inputs) is dict or isinstance(inputs, Mapping)  # dict: skip the ABC check
        ids = inputs.get("input_ids") if is_mapping else None
        tokens = ids.numel() if isinstance(ids, torch.Tensor) else 0
        cursor.tokens_seen += tokens
        if self._log_flops_and_tokens:
            cursor.flops_seen += self.floating_point_ops(inputs)
        else:  # upstream's total_flos estimate: 6 x non-embedding parameters x tokens
            cursor.flops_seen += self._flops_per_token * (tokens or n)
        mode = self.args.include_num_input_tokens_seen
        if mode != "no" and is_mapping:
            mask = inputs.get("attention_mask")
            ids = inputs.get("input_ids")
            if mode == "non_padding" and isinstance(mask, torch.Tensor):
                self.state.num_input_tokens_seen += int(mask.sum())
            elif isinstance(ids, torch.Tensor):
                self.state.num_input_tokens_seen += ids.numel()

    def _sync_state(self) -> None:
        self.state.global_step = self.cursor.steps_applied
        self.state.optimizer_step_attempts = self.cursor.steps_attempted
        self.state.epoch = self.cursor.fractional_epoch
        self.state.total_flos = self.cursor.flops_seen * self.runtime.world_size

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss that was backpropagated."""
        if not model.training:  # after an evaluation; calling train() every step costs ~50 us
            model.train()
        optimizer = self.optimizer
        if optimizer is not self._train_mode_of:  # looked up once per optimizer (a miss costs ~0.5 us)
            self._train_mode_of, self._optimizer_train = optimizer, getattr(optimizer, "train", None)
        if callable(self._optimizer_train):  # schedule-free: back to the training weights (no-op if there)
            self._optimizer_train()
        micro_items = items_in_batch(inputs, self._label_shift) if num_items_in_batch is not None else None
        inputs = self._prepare_inputs(inputs)
        if self._past_state is not None:
            inputs = self._past_state.feed(inputs)
        if self._plain_forward:  # no autocast, no overridden context: no context to enter (~1 us)
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        else:
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        if self._empty_cache is not None:  # after the forward, before the backward, as upstream
            self._empty_cache(self.state.global_step)
        if num_items_in_batch is not None:
            loss = self._scale_for_accumulation(loss, micro_items, num_items_in_batch)
        if self._engine is not None:  # DeepSpeed's, the fp16 scaler's, LOMO's fused backward, or plain
            self._engine.backward(loss)
        else:  # called outside train()
            loss.backward()
        return loss.detach()

    def _scale_for_accumulation(self, loss, micro_items, num_items_in_batch) -> torch.Tensor:
        if num_items_in_batch is None:
            return loss
        scaled = self.loss_is_scaled_for_ga
        if scaled is None:
            labels = micro_items is not None
            scaled = labels and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
            scaled = scaled and self._passes_num_items
        if not scaled:
            if micro_items.device.type == "cpu" and not micro_items:
                # no target in this micro-batch: a mean loss is 0/0 = NaN, and its weight is 0; its
                # gradient is zero either way, so it must not turn the step's logged loss into NaN
                loss = torch.nan_to_num(loss, nan=0.0)
            loss = loss * (micro_items.to(loss.device) / num_items_in_batch.to(loss.device))
        if self.runtime.distributed and self.args.average_tokens_across_devices:
            loss = loss * self.runtime.world_size  # DDP averages gradients over processes
        return loss

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
        if custom and "labels" in inputs:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
        passes = (
            not custom
            and num_items_in_batch is not None
            and self.model_accepts_loss_kwargs
            and "labels" in inputs
        )
        self._passes_num_items = passes or custom
        if passes:
            assert num_items_in_batch is not None  # passes checks it
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch.to(self.runtime.device)}
        outputs, labels = model_path.forward(self, model, inputs, labels, num_items_in_batch, return_outputs)
        if self._past_state is not None:
            self._past_state.keep(outputs)
        if labels is not None:
            if self.compute_loss_func is not None:
                loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
            else:
                assert self.label_smoother is not None  # labels were popped for it
                loss = self.label_smoother(
                    outputs, labels, shift_labels=self._label_shift, num_items_in_batch=num_items_in_batch
                )
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
        return (loss, outputs) if return_outputs else loss

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
        the window's losses are read from the Trainer's own loss window, `tr_loss` is informative)."""
        if self.control.should_log and self.cursor.steps_since_log > 0:
            self._log_training_window(grad_norm, learning_rate, start_time)
        elif self.cursor.steps_since_log >= _MAX_UNLOGGED_STEPS:
            self._fold_loss_window()  # bounded window and data_state.json without logging
        if self.control.should_evaluate:
            self._eval_stops_on_preemption = True  # a preemption stops it at its next batch
            try:
                metrics = self._evaluate(trial, ignore_keys_for_eval)
            except _EvaluationPreempted as stopped:
                metrics = None
                logger.warning("%s: no evaluation metrics for step %d.", stopped, self.state.global_step)
            finally:
                self._eval_stops_on_preemption = False
            if metrics is not None:
                is_new_best = self._determine_best_metric(metrics=metrics, trial=trial)
                if self.args.save_strategy == "best":
                    self.control.should_save = is_new_best
            if self._preempted():  # arrived during the evaluation: save and stop all the same
                self.control.should_save = self.control.should_training_stop = True
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            if not async_saves.defer_on_save(self):  # async_save: on_save fires once it is durable
                self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _save_checkpoint(self, model: nn.Module | None = None, trial: Any = None) -> None:
        path = async_saves.save(self) if self.args.async_save else training_checkpoint.save(self)
        if path is not None and self.args.push_to_hub:  # None: written in the background, pushed when durable
            self._push_from_checkpoint(path)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the model (safetensors), the processing class and training_args.json.

        Every process calls it (a sharded model is gathered first); the writing process calls
        `_save`. Checkpoints write their weights through it too (`_internal_call=True`)."""
        output_dir = output_dir or self.args.output_dir
        assert output_dir is not None  # TrainingArguments.__post_init__ fills output_dir in
        async_saves.wait(self)  # a checkpoint being written in the background is finished first
        training_checkpoint.save_model(self, output_dir)
        if self.args.push_to_hub and not _internal_call:  # documented: a user's save_model pushes
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write weights (`state_dict`, else the model's), processing class and training_args.json."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        assert output_dir is not None  # TrainingArguments.__post_init__ fills output_dir in
        os.makedirs(output_dir, exist_ok=True)
        training_checkpoint.write_model(self, output_dir, state_dict=state_dict)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Load a checkpoint's weights into `model` (default: the Trainer's)."""
        training_checkpoint.load_weights(
            self, resume_from_checkpoint, model if model is not None else self.model
        )

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Restore this process's random generators from a checkpoint folder (a missing file warns,
        a damaged one is an error)."""
        if checkpoint is not None:
            training_checkpoint.load_rng_state(self, checkpoint)

    def _load_best_model(self) -> None:
        """Load the weights of `state.best_model_checkpoint` (load_best_model_at_end)."""
        async_saves.wait(self)  # called directly mid-training too: the checkpoint being written first
        best = self.state.best_model_checkpoint
        logger.info("Loading the best model from %s (score: %s).", best, self.state.best_metric)
        assert best is not None  # called only when there is a best checkpoint
        self._load_from_checkpoint(best)

    def _overrides(self, name: str) -> bool:
        """Whether a subclass overrides the Trainer method `name` (then it is called as upstream does)."""
        return getattr(type(self), name) is not getattr(Trainer, name)

    def _finalize_training(self, start_time: float) -> TrainOutput:
        cursor, args = self.cursor, self.args
        async_saves.wait(self)  # the last checkpoint durable (its on_save fired) before the best loads
        if cursor.steps_since_log > 0 and args.logging_strategy != "no":
            self._log_training_window(self._grad_norm, self._last_lr, start_time)  # the last partial window
        elif cursor.steps_since_log > 0:  # unlogged steps still count in train_loss
            self._fold_loss_window()
        train_loss = cursor.loss_logged_total / max(cursor.steps_attempted, 1)
        steps_run = cursor.steps_applied - cursor.first_step_of_call
        samples_run = (cursor.samples_seen - self._samples_at_start) * self.runtime.world_size
        tokens_run = (cursor.tokens_seen - self._tokens_at_start) * self.runtime.world_size
        metrics = speed_metrics(
            "train",
            start_time,
            num_samples=samples_run,
            num_steps=steps_run,
            num_tokens=tokens_run if args.include_tokens_per_second else None,  # v4
        )
        self.store_flos()
        metrics["total_flos"] = self.state.total_flos
        metrics["train_loss"] = train_loss
        self._memory_tracker.stop_and_update_metrics("train", metrics)
        self.log(metrics)
        if args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._load_best_model()
        training_checkpoint.cleanup_after_training(self)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        self._finish_current_push()  # the last checkpoint's upload is done when train() returns
        return TrainOutput(self.state.global_step, train_loss, metrics)


def _epoch_done(cursor: LoopCursor) -> bool:
    return cursor.steps_in_epoch > 0 and cursor.batch_in_epoch >= cursor.steps_in_epoch

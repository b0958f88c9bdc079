"""`TrainerAPI`: the part of transformers' Trainer surface that forwards to the parts.

Callbacks, upstream's public facts, data loaders and samplers, optimizer and schedule creation,
precision contexts, metrics files, the Hub and the model card, evaluation and prediction, the
search, the log rows and the best-metric record. Each method is a thin call into the module that
does the work (`dataloaders`, `optimization`, `prediction`, `hub`, ...), so a subclass that
overrides one is still called. `Trainer` (trainer.py) extends it with construction and the loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwright.args.training_args import TrainingArguments
from trainwright.checkpoint.weights import check_load_result
from trainwright.core.events import TrainerCallback
from trainwright.core.state import LoopCursor, metric_improves
from trainwright.distributed.accelerator import RuntimeAccelerator
from trainwright.distributed.engine import load_weights
from trainwright.loop import batch_size_finder, optimization
from trainwright.loop.checkpoints.checkpointer import load_rng_state, run_dir
from trainwright.loop.checkpoints.parts import write_model
from trainwright.loop.eval import hooks as prediction
from trainwright.loop.hub import push as hub
from trainwright.loop.trainer_setup import TrainerSetup
from trainwright.observe.flops import FlopsEstimator
from trainwright.observe.metrics import (
    EvalLoopOutput,
    PredictionOutput,
)
from trainwright.observe.metrics import log_metrics as _log_metrics
from trainwright.observe.metrics import metrics_format as _metrics_format
from trainwright.observe.metrics import save_metrics as _save_metrics
from trainwright.optim.optimizers import get_optimizer_cls_and_kwargs as _get_optimizer_cls_and_kwargs
from trainwright.optim.schedules import get_learning_rates, steps_on_metric

logger = logging.getLogger(__name__)

_NO_CONTEXT = contextlib.nullcontext()  # reusable: nullcontext keeps no state


class TrainerAPI(TrainerSetup):
    """Upstream's Trainer methods that are not the loop: each calls into the part that does it."""

    # ------------------------------------------------------------------ callbacks
    def add_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> TrainerCallback | None:
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        self.callback_handler.remove_callback(callback)

    # ------------------------------------------------------------------ upstream's public facts
    is_fsdp_xla_enabled = is_fsdp_xla_v1_enabled = is_fsdp_xla_v2_enabled = False  # no TPU/XLA engine

    is_distributed_loading_by_transformers = False

    hp_name: Callable | None = None

    @property
    def tokenizer(self) -> Any:
        """Deprecated name of `processing_class` (v4)."""
        warnings.warn(
            "Trainer.tokenizer is deprecated: use Trainer.processing_class.", FutureWarning, stacklevel=2
        )
        return self.processing_class

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        warnings.warn(
            "Trainer.tokenizer is deprecated: use Trainer.processing_class.", FutureWarning, stacklevel=2
        )
        self.processing_class = value

    @property
    def accelerator(self) -> RuntimeAccelerator:
        """accelerate's `Accelerator` surface over this Trainer's runtime and run (distributed/accelerator.py)."""
        return self._accelerator

    @accelerator.setter
    def accelerator(self, value: Any) -> None:
        # upstream's is a plain attribute: a library (or TRL's tests, on a Trainer made with
        # object.__new__) puts its own there, and the code that reads trainer.accelerator gets it
        self._accelerator = value

    @property
    def current_gradient_accumulation_steps(self) -> int:
        """Micro-batches in the step being taken (upstream's attribute; the argument outside a step)."""
        run = self._run
        return (
            run.position.step_micro_batches
            if run is not None and run.position.step_micro_batches
            else self.args.gradient_accumulation_steps
        )

    @property
    def gather_function(self) -> Callable:
        return self.accelerator.gather

    @property
    def is_deepspeed_enabled(self) -> bool:
        return bool(self.args.deepspeed)

    @property
    def is_fsdp_enabled(self) -> bool:
        return bool(self.args.fsdp)

    @property
    def deepspeed(self) -> Any:
        """The DeepSpeed engine of the current (or last) `deepspeed` run, else None."""
        return self._run.engine.deepspeed if self._run is not None else None

    @property
    def is_model_parallel(self) -> bool:
        """Whether the model is spread over several devices by a `device_map`."""
        device_map = getattr(self.model, "hf_device_map", None)
        return isinstance(device_map, dict) and len(set(device_map.values())) > 1

    @property
    def place_model_on_device(self) -> bool:
        return not self.is_model_parallel and not (self.args.fp16_full_eval or self.args.bf16_full_eval)

    @property
    def cursor(self) -> LoopCursor:
        """Where the current (or last) run is: samples, tokens, FLOPs seen, steps, epoch position."""
        return self._run.position.cursor if self._run is not None else LoopCursor()

    @property
    def current_flos(self) -> float:
        """FLOPs this process has trained on so far (total_flos is summed over processes)."""
        return self.cursor.flops_seen

    def get_tp_size(self) -> int:
        return self.runtime.parallel_size("tp")  # parallelism_config's, else 1

    def get_cp_size(self) -> int:
        return self.runtime.parallel_size("cp")

    def get_sp_size(self) -> int:
        return 1  # no sequence parallelism

    def end(self) -> None:
        """Destroy the process group, once everything that needs the other processes is done."""
        self.runtime.shutdown()

    # ------------------------------------------------------------------ optimizer / schedule
    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self.create_optimizer()
        self.create_scheduler(num_training_steps, self.optimizer)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """AdamW (fused where supported) with no weight decay on biases and norm weights."""
        if self.optimizer is None:
            self.optimizer = optimization.make_optimizer(
                model or self.model,
                self.args,
                self.optimizer_cls_and_kwargs,
                self.get_optimizer_cls_and_kwargs,
            )
        return self.optimizer

    @staticmethod
    def get_optimizer_cls_and_kwargs(
        args: TrainingArguments, model: nn.Module | None = None
    ) -> tuple[Any, Any]:
        """The optimizer class for `args.optim` and its kwargs (all but the parameters), as upstream.

        `model` is needed by GaLore, APOLLO and LOMO (and picks the fused AdamW kernel). kwargs may
        hold `params`, `model` or `optimizer_dict`, which replace the decay param groups.
        """
        return _get_optimizer_cls_and_kwargs(args, model)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_scheduler is None:
            optimizer = optimizer or self.optimizer
            if optimizer is None:
                raise RuntimeError("create_scheduler needs an optimizer: call create_optimizer() first.")
            self.lr_scheduler = optimization.make_scheduler(self.args, optimizer, num_training_steps)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def get_learning_rates(self) -> list[float]:
        if self.optimizer is None:
            raise ValueError("The optimizer has not been created yet.")
        return get_learning_rates(self.optimizer)

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Names of the parameters that get weight decay (all but biases and norm weights)."""
        from trainwright.optim.optimizers import get_decay_parameter_names

        return get_decay_parameter_names(model)

    def get_optimizer_group(self, param: Any = None) -> Any:
        """The optimizer's parameter group holding `param`, or every group's parameters."""
        return optimization.optimizer_group(self.optimizer, param)

    def get_num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def _scheduler_is_plateau(self) -> bool:
        return steps_on_metric(self.lr_scheduler)

    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader: Any = None) -> nn.Module:
        """The model as training runs it: DDP or FSDP2 over several processes, else itself (the
        run's engine decides)."""
        if not training or self._run is None:
            return model
        return self._run.engine.wrap(model)

    def _wants_flops(self) -> bool:
        return any(getattr(cb, "needs_flops", False) for cb in self.callback_handler.callbacks)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """FLOPs of one forward+backward on `inputs` (see flops.py for the sources, cached per shape)."""
        if self._flops is None or self._flops.model is not self.model:
            self._flops = FlopsEstimator(self.model)
        return int(self._flops(inputs))

    def store_flos(self) -> None:
        self.state.total_flos = self.cursor.flops_seen * self.runtime.data_world_size

    # ------------------------------------------------------------------ log / evaluate / save

    def _evaluate(
        self, trial: Any, ignore_keys_for_eval: Any, skip_scheduler: bool = False
    ) -> dict[str, float]:
        """Evaluate, report to the HP search, step a ReduceLROnPlateau scheduler; the metrics."""
        oom_guard = (
            batch_size_finder.evaluation_oom_is_an_error() if self.args.auto_find_batch_size else _NO_CONTEXT
        )
        with oom_guard:
            metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        if trial is not None and self.hp_search_backend is not None:
            from trainwright.loop.search.hpo import report_to_hp_search

            def stop() -> None:  # a trial the backend stops ends first, as upstream's does
                self.callback_handler.on_train_end(self.args, self.state, self.control)

            report_to_hp_search(self._hp_search, trial, metrics, self.state.global_step, stop)
        if self._scheduler_is_plateau() and not skip_scheduler:
            self.lr_scheduler.step(metrics[self._metric_key()])
        return metrics

    def _hp_trial_record(self, trial: Any) -> tuple[str, dict[str, Any]]:
        """The trial's run name and parameters for `TrainerState` (the search layer knows both)."""
        from trainwright.loop.search.hpo import trial_params, trial_run_name

        return trial_run_name(self._hp_search, trial), trial_params(trial)

    def _metric_key(self) -> str:
        name = self.args.metric_for_best_model or "loss"
        return name if name.startswith("eval_") else f"eval_{name}"

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any = None) -> bool:
        """Record `metrics` in best_metric / best_global_step when they beat it; True when new best."""
        if self.args.metric_for_best_model is None:
            return False
        key = self._metric_key()
        if key not in metrics:
            raise KeyError(
                f"metric_for_best_model={self.args.metric_for_best_model!r} gives the key {key!r}, which "
                f"the evaluation did not return. It returned: {sorted(metrics)}."
            )
        value = metrics[key]
        if metric_improves(value, self.state.best_metric, bool(self.args.greater_is_better)):
            self.state.best_metric = value
            if self.args.save_strategy != "no":
                self.state.best_global_step = self.state.global_step
            return True
        return False

    def save_state(self) -> None:
        """Write trainer_state.json to output_dir (main process only)."""
        if self.is_world_process_zero():
            assert self.args.output_dir is not None  # TrainingArguments.__post_init__ fills it in
            self.state.save_to_json(os.path.join(self.args.output_dir, "trainer_state.json"))

    def log_metrics(self, split: str, metrics: dict[str, float]) -> None:
        """Print metrics in upstream's table format (main process only)."""
        _log_metrics(split, metrics, is_world_process_zero=self.is_world_process_zero())

    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """Write `<split>_results.json`, merged into `all_results.json` when combined."""
        assert self.args.output_dir is not None  # TrainingArguments.__post_init__ fills it in
        _save_metrics(
            self.args.output_dir, split, metrics, combined, is_world_process_zero=self.is_world_process_zero()
        )

    def metrics_format(self, metrics: dict[str, float]) -> dict[str, Any]:
        return _metrics_format(metrics)

    def _get_output_dir(self, trial: Any) -> str:
        """Where this run's checkpoints go: output_dir, or a search trial's folder in it (upstream's
        hook: a subclass's override moves them; TRL's GRPO writes files of its own there)."""
        trial_name = (
            None if trial is None or self.hp_search_backend is None else self._hp_trial_record(trial)[0]
        )
        return run_dir(self.args.output_dir, trial_name)

    def _forget_failed_run(self) -> None:
        """auto_find_batch_size: drop what a try that ran out of memory left (its run, the wrapper,
        the gradients, a Trainer-made schedule for the old number of steps)."""
        run = self._run
        if run is not None and run.position.cursor.steps_applied > run.position.cursor.first_step_of_call:
            logger.warning(
                "auto_find_batch_size: the out-of-memory error came after %d optimizer steps; the retry "
                "starts from the weights and optimizer state they left (as transformers does).",
                run.position.cursor.steps_applied - run.position.cursor.first_step_of_call,
            )
        if run is not None:
            run.checkpointer.abandon()
            run.close()
        self._run = None
        self.model_wrapped = self.model  # the failed try's wrapper (DDP buckets, compile) goes
        self._hand_accelerator()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self._created_lr_scheduler:
            self.lr_scheduler = None  # re-made for the new number of steps

    # ------------------------------------------------------------------ checkpoint hooks (the checkpointer calls them: a subclass's override runs)
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
        write_model(
            output_dir,
            self.model,
            self.args,
            self.processing_class,
            self.data_collator,
            state_dict=state_dict,
        )

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
        self._run.checkpointer.load_optimizer_and_scheduler(checkpoint, self, self._run)

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

    # ------------------------------------------------------------------ Hub and model card

    def create_model_card(
        self,
        language: str | None = None,
        license: str | None = None,
        tags: str | list[str] | None = None,
        model_name: str | None = None,
        finetuned_from: str | None = None,
        tasks: str | list[str] | None = None,
        dataset_tags: str | list[str] | None = None,
        dataset: str | list[str] | None = None,
        dataset_args: str | list[str] | None = None,
    ) -> None:
        """Write `output_dir/README.md`: metadata, hyperparameters and the results of
        `state.log_history` (main process only; see `model_card.py`)."""
        from trainwright.loop.hub.model_card import write_model_card

        if self.is_world_process_zero():
            write_model_card(
                self._card_source(), language=language, license=license, tags=tags, model_name=model_name,
                finetuned_from=finetuned_from, tasks=tasks, dataset_tags=dataset_tags, dataset=dataset,
                dataset_args=dataset_args,
            )  # fmt: skip

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Save the model, write its card (`kwargs` go to `create_model_card`) and upload output_dir
        to `hub_model_id`. Returns the commit info, or a Future of it when not `blocking`."""
        push = self._hub_push(token if token is not None else self.args.hub_token, private)
        hooks = (self.save_model, self.create_model_card)  # upstream's, called where upstream calls them
        return hub.push_to_hub(push, *hooks, commit_message, blocking, token, revision, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Push a checkpoint just saved in the background, as `hub_strategy` says."""
        pushed = hub.push_from_checkpoint(self._hub_push(), checkpoint_folder)
        if pushed is not None:
            self.push_in_progress = pushed

    def _finish_current_push(self) -> None:
        """Wait for the background push of the last checkpoint."""
        hub.finish_current_push(getattr(self, "push_in_progress", None))

    # ------------------------------------------------------------------ evaluate / predict
    def evaluate(
        self,
        eval_dataset: Dataset | dict[str, Dataset] | str | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        """Evaluate; with a dict of datasets, each one's metrics are prefixed `eval_<name>_`."""
        self._sync_args()
        datasets = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(datasets, dict):
            given = eval_dataset is not None
            return prediction.evaluate_each(self.evaluate, datasets, given, ignore_keys, metric_key_prefix)
        loss_only = True if self.compute_metrics is None else None
        call = self._prediction_call(self.get_eval_dataloader)
        return call.evaluate(eval_dataset, ignore_keys, metric_key_prefix, loss_only)

    def predict(
        self, test_dataset: Dataset, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> PredictionOutput:
        """Predictions (padded with -100 across batches), labels and metrics for a dataset."""
        self._sync_args()
        return self._prediction_call(self.get_test_dataloader).predict(
            test_dataset, ignore_keys, metric_key_prefix
        )

    def _prediction_call(self, loader: Callable[[Any], Any]) -> prediction.PredictionCall:
        """What one evaluate() / predict() reads of the Trainer, taken now; its hooks bound."""
        whole, memory, loop = _whole(self), self._memory_tracker, self.evaluation_loop
        args = (self.args, self.runtime, self.state, memory, self.is_in_train, self._metric_key())
        return prediction.PredictionCall(*args, loader=loader, loop=loop, fire=whole._fire, log=whole.log)

    def evaluation_loop(
        self,
        dataloader: torch.utils.data.DataLoader,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """Run `prediction_step` over a dataloader, streaming results to the CPU."""
        run = self._run  # the loop's own evaluation (`run.evaluating()`) stops at a preemption
        stops = run if run is not None and run.eval_stops_on_preemption else None
        call = prediction.LoopCall(
            self.args, self.runtime, self.model, self.optimizer, self.callback_handler,
            in_train=self.is_in_train,
            compute_metrics=self.compute_metrics,
            preprocess=self.preprocess_logits_for_metrics,
            step=self.prediction_step,  # the hooks, bound: a subclass's overrides run
            num_examples=self.num_examples,
            fire=_whole(self)._fire,
            collective=run is not None and run.engine.collective_forward,
            preempted=stops.preempted if stops else None,
            preemption=stops.preemption if stops else None,
        )  # fmt: skip
        return call.run(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """(loss, logits, labels) for one batch, without gradients."""
        whole = _whole(self)  # its step-path hooks, bound: a subclass's overrides run
        return prediction.prediction_step(
            model, inputs, prediction_loss_only, ignore_keys, self.label_names, self.can_return_loss,
            whole._prepare_inputs, whole.compute_loss, whole.compute_loss_context_manager,
        )  # fmt: skip

    # ------------------------------------------------------------------ hyperparameter search
    def hyperparameter_search(self, *args: Any, **kwargs: Any):
        """Search hyperparameters with optuna or Ray Tune (see `trainwright.loop.search.hpo`, `.ray_tune`)."""
        from trainwright.loop.search.hpo import run_hyperparameter_search

        return run_hyperparameter_search(_whole(self), self._hp_search_scope, *args, **kwargs)

    @contextlib.contextmanager
    def _hp_search_scope(self, backend: str, search: Any) -> Iterator[None]:
        """While a search runs: its backend and state on the Trainer, no run or kept eval loader from
        before (each trial builds its own); the caller's arguments back after."""
        base_args = self.args
        self.hp_search_backend, self._hp_search, self._run = backend, search, None
        self._eval_dataloaders, self._eval_dataloader_datasets = {}, {}
        try:
            yield
        finally:
            self.args, self.hp_search_backend, self._hp_search = base_args, None, None
            self._hand_accelerator()

    def _hp_search_setup(self, trial: Any) -> None:
        """Upstream's hook at the start of `train(trial=...)`: a search trial's arguments (the search's
        base arguments with the trial's values)."""
        if trial is not None and self._hp_search is not None:
            self.args = self._hp_search.trial_args(trial)
            self._hand_accelerator()  # upstream makes a new accelerator for each trial


def _whole(part: TrainerSetup) -> Any:
    """`part` as the whole Trainer it always is (the chain's bases are never built alone), for the
    modules that take a Trainer: their Protocols name members of every class of the chain."""
    return part

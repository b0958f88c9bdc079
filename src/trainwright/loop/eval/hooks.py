"""Evaluation and prediction: `evaluate`, `predict`, the evaluation loop and one prediction step.

The Trainer's methods of these names are thin and call in here, so a subclass that overrides one
(`evaluate`, `evaluation_loop`, `prediction_step`, `get_eval_dataloader`, `num_examples`, ...) is
still called: everything below calls the Trainer's methods, never its own functions, for every
upstream hook. The trainer is seen through `PredictionTrainer`, so this module never imports the
loop's trainer.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from functools import cache, partial
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwright import data as data_utils
from trainwright.args.training_args import TrainingArguments
from trainwright.core.events import CallbackHandler
from trainwright.core.nested import detach
from trainwright.core.runtime import Runtime
from trainwright.core.state import TrainerControl, TrainerState
from trainwright.distributed import collectives
from trainwright.loop.eval.batches import deals_whole_batches, real_batches
from trainwright.loop.eval.gather import EvalGatherer, EvalResult
from trainwright.loop.eval.loop import Evaluation
from trainwright.loop.run import TrainingRun
from trainwright.modeling import fused_loss, liger
from trainwright.observe.memory import TrainerMemoryTracker
from trainwright.observe.metrics import (
    EvalLoopOutput,
    EvalPrediction,
    PredictionOutput,
    denumpify_detensorize,
    speed_metrics,
)

logger = logging.getLogger(__name__)


class PredictionTrainer(Protocol):
    """What evaluation and prediction read and set of the Trainer."""

    args: TrainingArguments
    runtime: Runtime
    model: nn.Module
    optimizer: Any
    state: TrainerState
    control: TrainerControl
    callback_handler: CallbackHandler
    eval_dataset: Any
    compute_metrics: Callable[..., dict] | None
    preprocess_logits_for_metrics: Callable | None
    label_names: list[str]
    can_return_loss: bool
    is_in_train: bool
    _memory_tracker: TrainerMemoryTracker
    _run: TrainingRun | None

    def evaluate(self, *args: Any, **kwargs: Any) -> Any: ...
    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any: ...
    def prediction_step(self, *args: Any, **kwargs: Any) -> Any: ...
    def get_eval_dataloader(self, *args: Any, **kwargs: Any) -> Any: ...
    def get_test_dataloader(self, *args: Any, **kwargs: Any) -> Any: ...
    def num_examples(self, *args: Any, **kwargs: Any) -> Any: ...
    def log(self, *args: Any, **kwargs: Any) -> Any: ...
    def compute_loss(self, *args: Any, **kwargs: Any) -> Any: ...
    def compute_loss_context_manager(self) -> Any: ...
    def _prepare_inputs(self, inputs: Any) -> Any: ...
    def _fire(self, event: str, state: Any = None, extra: dict | None = None) -> None: ...
    def _metric_key(self) -> str: ...


class EvaluationPreempted(Exception):
    """A preemption signal stopped the in-training evaluation; the checkpoint is written instead."""


def evaluate(
    trainer: PredictionTrainer,
    eval_dataset: Dataset | dict[str, Dataset] | str | None = None,
    ignore_keys: list[str] | None = None,
    metric_key_prefix: str = "eval",
) -> dict[str, float]:
    """Evaluate; with a dict of datasets, each one's metrics are prefixed `eval_<name>_`."""
    datasets = eval_dataset if eval_dataset is not None else trainer.eval_dataset
    if isinstance(datasets, dict):
        metrics: dict[str, float] = {}
        for name, dataset in datasets.items():
            metrics.update(
                trainer.evaluate(
                    eval_dataset=dataset if eval_dataset is not None else name,
                    ignore_keys=ignore_keys,
                    metric_key_prefix=f"{metric_key_prefix}_{name}",
                )
            )
        return metrics
    trainer._memory_tracker.start("eval")
    assert not isinstance(eval_dataset, dict)  # a dict of datasets was evaluated one by one above
    dataloader = trainer.get_eval_dataloader(eval_dataset)
    start = time.time()
    output = trainer.evaluation_loop(
        dataloader,
        description="Evaluation",
        prediction_loss_only=True if trainer.compute_metrics is None else None,
        ignore_keys=ignore_keys,
        metric_key_prefix=metric_key_prefix,
    )
    if output.num_samples == 0:
        no_samples(trainer, dataloader, "eval_dataset", metric_key_prefix)
    add_speed_metrics(trainer, output, metric_key_prefix, start)
    trainer.log(output.metrics)
    trainer._fire("on_evaluate", extra={"metrics": output.metrics})
    trainer._memory_tracker.stop_and_update_metrics("eval", output.metrics)
    return output.metrics


def no_samples(trainer: PredictionTrainer, dataloader: Any, name: str, prefix: str) -> None:
    """Warn that the dataset gave no samples (upstream returns its metrics silently); during training
    with `metric_for_best_model` on this evaluation's keys, refuse with the reason instead."""
    kind = type(getattr(dataloader, "dataset", None)).__name__
    message = f"{name} ({kind}) gave no samples: its metrics hold timings only (no {prefix}_loss)"
    key = trainer._metric_key()
    if (
        trainer.is_in_train
        and trainer.args.metric_for_best_model is not None
        and key.startswith(f"{prefix}_")
    ):
        raise ValueError(
            f"{message}, and metric_for_best_model={trainer.args.metric_for_best_model!r} needs {key!r} "
            f"at step {trainer.state.global_step}. Give {name} samples."
        )
    logger.warning("%s.", message)


def add_speed_metrics(trainer: PredictionTrainer, output: EvalLoopOutput, prefix: str, start: float) -> None:
    batches = math.ceil(
        output.num_samples / (trainer.args.per_device_eval_batch_size * trainer.runtime.data_world_size)
    )
    output.metrics.update(speed_metrics(prefix, start, num_samples=output.num_samples, num_steps=batches))


def predict(
    trainer: PredictionTrainer,
    test_dataset: Dataset,
    ignore_keys: list[str] | None = None,
    metric_key_prefix: str = "test",
) -> PredictionOutput:
    """Predictions (padded with -100 across batches), labels and metrics for a dataset."""
    trainer._memory_tracker.start("test")
    dataloader = trainer.get_test_dataloader(test_dataset)
    start = time.time()
    output = trainer.evaluation_loop(
        dataloader, description="Prediction", ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix
    )
    if output.num_samples == 0:
        no_samples(trainer, dataloader, "test_dataset", metric_key_prefix)
    add_speed_metrics(trainer, output, metric_key_prefix, start)
    trainer._fire("on_predict", extra={"metrics": output.metrics})
    trainer._memory_tracker.stop_and_update_metrics("test", output.metrics)
    return PredictionOutput(
        predictions=output.predictions, label_ids=output.label_ids, metrics=output.metrics
    )


def model_for_eval(trainer: PredictionTrainer) -> nn.Module:
    model = trainer.model
    if not trainer.is_in_train and (trainer.args.fp16_full_eval or trainer.args.bf16_full_eval):
        dtype = torch.float16 if trainer.args.fp16_full_eval else torch.bfloat16
        model = model.to(dtype=dtype, device=trainer.runtime.device)
    return model


def evaluation_loop(
    trainer: PredictionTrainer,
    dataloader: torch.utils.data.DataLoader,
    description: str,
    prediction_loss_only: bool | None = None,
    ignore_keys: list[str] | None = None,
    metric_key_prefix: str = "eval",
) -> EvalLoopOutput:
    """Run `prediction_step` over a dataloader, streaming results to the CPU."""
    if prediction_loss_only is None:
        prediction_loss_only = trainer.args.prediction_loss_only
    model = model_for_eval(trainer)
    model.eval()
    optimizer: Any = trainer.optimizer  # schedule-free optimizers have eval()/train()
    if hasattr(optimizer, "eval") and callable(optimizer.eval):
        optimizer.eval()
    trainer.callback_handler.eval_dataloader = dataloader
    evaluation = build_evaluation(trainer, model, dataloader, description, prediction_loss_only, ignore_keys)
    # mixed precision: float32 outputs, as from upstream's prepared forward (train() holds them already)
    mixed = (trainer.args.bf16 or trainer.args.fp16) and not trainer.is_in_train
    with collectives.float32_outputs(model) if mixed else contextlib.nullcontext():
        # the samples evaluated: the sampler's repeats cut before the forward
        result, metrics = evaluation.run()
    if evaluation.batch_metrics is None:
        metrics = _metrics_of(trainer, result) or metrics
    metrics = denumpify_detensorize(dict(metrics or {}))
    if result.loss is not None:
        metrics["loss"] = result.loss
    for key in list(metrics):
        if not key.startswith(f"{metric_key_prefix}_"):
            metrics[f"{metric_key_prefix}_{key}"] = metrics.pop(key)
    counted = data_utils.has_length(getattr(dataloader, "dataset", None))
    return EvalLoopOutput(
        predictions=result.predictions,
        label_ids=result.label_ids,
        metrics=metrics,
        num_samples=trainer.num_examples(dataloader) if counted else result.num_samples,
    )


def build_evaluation(
    trainer: PredictionTrainer,
    model: nn.Module,
    dataloader: Any,
    description: str,
    loss_only: bool,
    ignore_keys: list[str] | None,
) -> Evaluation:
    """One evaluation's component, every choice made here: outputs kept or not, metrics per batch or
    at the end, the model's inputs kept for metrics, a collective forward, the stop check."""
    args = trainer.args
    num_batches = len(dataloader) if data_utils.has_length(dataloader) else None
    run = trainer._run
    gatherer = EvalGatherer(
        trainer.runtime,
        offload_every=args.eval_accumulation_steps or 1,
        # with batch_eval_metrics only predict() keeps what it predicted (evaluate needs metrics)
        keep_outputs=not loss_only and (not args.batch_eval_metrics or description == "Prediction"),
        do_concat=args.eval_do_concat_batches,
        by_batch=deals_whole_batches(dataloader),
    )
    return Evaluation(
        # positional as upstream calls it: a subclass may name the flag otherwise
        step=lambda inputs: trainer.prediction_step(model, inputs, loss_only, ignore_keys=ignore_keys),
        batches=real_batches(
            dataloader,
            _preemption_check(trainer, num_batches),
            collective=run is not None and run.engine.collective_forward,
        ),
        gatherer=gatherer,
        on_step=partial(trainer._fire, "on_prediction_step"),
        preprocess=trainer.preprocess_logits_for_metrics,
        batch_metrics=trainer.compute_metrics if args.batch_eval_metrics else None,
        last_batch=None if num_batches is None else num_batches - 1,
        keep_inputs="inputs" in (args.include_for_metrics or []),
    )


def _preemption_check(trainer: PredictionTrainer, num_batches: int | None) -> Callable[[int], None] | None:
    """The loop's own evaluation stops at a preemption: checked before every batch; with several
    processes a collective, so only where every process has the same number of batches (a sized
    loader: even_batches=False may leave them different)."""
    run, runtime = trainer._run, trainer.runtime
    if run is None or not run.eval_stops_on_preemption:
        return None
    if runtime.distributed and (num_batches is None or len(set(runtime.all_gather_object(num_batches))) != 1):
        return None

    def check(index: int) -> None:
        if run.preempted():
            signal_name = getattr(run.preemption.requested, "name", "a preemption signal")
            raise EvaluationPreempted(
                f"Evaluation stopped by {signal_name} after {index} of {num_batches or '?'} batches"
            )

    return check


def _metrics_of(trainer: PredictionTrainer, result: EvalResult) -> dict[str, Any] | None:
    """`compute_metrics` over the whole evaluation's predictions (None without them)."""
    if trainer.compute_metrics is None or result.predictions is None or result.label_ids is None:
        return None
    include = set(trainer.args.include_for_metrics or [])
    return trainer.compute_metrics(
        EvalPrediction(
            predictions=result.predictions,
            label_ids=result.label_ids,
            inputs=result.inputs if "inputs" in include else None,
            losses=result.losses if "loss" in include else None,
        )
    )


def prediction_step(
    trainer: PredictionTrainer,
    model: nn.Module,
    inputs: dict[str, Any],
    prediction_loss_only: bool,
    ignore_keys: list[str] | None = None,
) -> tuple[torch.Tensor | None, Any, Any]:
    """(loss, logits, labels) for one batch, without gradients."""
    has_labels = bool(trainer.label_names) and all(inputs.get(k) is not None for k in trainer.label_names)
    return_loss = inputs.get("return_loss")
    # as upstream: a loss without labels only where there are no label names (TRL's reward trainer
    # empties them); a batch missing its named labels is predicted without a loss
    loss_without_labels = not trainer.label_names and (
        bool(return_loss) if return_loss is not None else trainer.can_return_loss
    )
    inputs = trainer._prepare_inputs(inputs)
    if ignore_keys is None:
        config = getattr(model, "config", None)
        ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", [cache_output_key()]) or [])
    labels = None
    if has_labels or loss_without_labels:
        # without label names the labels are an empty tuple, not None: `compute_metrics` is still called
        found = tuple(detach(inputs.get(name)) for name in trainer.label_names)
        labels = found[0] if len(found) == 1 else found
    loss = None
    with torch.no_grad(), trainer.compute_loss_context_manager():
        if has_labels or loss_without_labels:
            with fused_loss.loss_only(prediction_loss_only):  # then the fused loss may skip the logits
                loss, outputs = trainer.compute_loss(
                    model, _loss_inputs(model, inputs, prediction_loss_only), return_outputs=True
                )
            loss = loss.detach().mean()
            logits = _logits_of(outputs, set(ignore_keys) | {"loss"}, drop_first=True)
        else:
            logits = _logits_of(model(**inputs), set(ignore_keys), drop_first=False)
    if prediction_loss_only:
        return loss, None, None
    logits = detach(logits)
    if isinstance(logits, (tuple, list)) and len(logits) == 1:
        logits = logits[0]
    if isinstance(logits, (tuple, list)) and len(logits) == 0:
        logits = None
    return loss, logits, labels


def _loss_inputs(model: nn.Module, inputs: dict[str, Any], loss_only: bool) -> dict[str, Any]:
    """The inputs of a forward for the loss: a forward for the loss alone asks Liger's kernels to
    skip the logits (`skip_logits`, as upstream; the fused loss reads `fused_loss.loss_only`)."""
    return {**inputs, "skip_logits": True} if loss_only and liger.is_applied(model) else inputs


@cache
def cache_output_key() -> str:
    """The output key of the key/value cache that prediction drops by default, as the installed
    transformers names it: `cache` since 5.24, `past_key_values` before (and without transformers)."""
    try:
        from transformers.modeling_outputs import CausalLMOutputWithPast
    except ImportError:
        return "past_key_values"
    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def _logits_of(outputs: Any, skip: set[str], drop_first: bool) -> Any:
    """A model's outputs but the skipped keys; a tuple output loses its loss (first) where it has one."""
    if isinstance(outputs, dict):
        return tuple(v for k, v in outputs.items() if k not in skip)
    if not drop_first:
        return outputs
    return outputs[1:] if isinstance(outputs, (tuple, list)) else ()

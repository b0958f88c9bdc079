"""Evaluation and prediction: `evaluate`, `predict`, the evaluation loop and one prediction step.

The Trainer's methods of these names are thin and call in here, so a subclass that overrides one
(`evaluate`, `evaluation_loop`, `prediction_step`, `get_eval_dataloader`, `num_examples`, ...) is
still called: everything below calls the Trainer's methods, never its own functions, for every
upstream hook. The trainer is seen through `PredictionTrainer`, so this module never imports the
loop's trainer.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwright import data as data_utils
from trainwright.args.training_args import TrainingArguments
from trainwright.core.events import CallbackHandler
from trainwright.core.runtime import Runtime
from trainwright.core.state import TrainerControl, TrainerState
from trainwright.data import packing
from trainwright.data.distribute import same_mapping
from trainwright.loop.evaluation import EvalGatherer
from trainwright.loop.run import TrainingRun
from trainwright.modeling import fused_loss, liger
from trainwright.modeling.loss import batch_size
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
    def _fire(self, event: str, state: Any = None, **kwargs: Any) -> None: ...
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
    trainer._fire("on_evaluate", metrics=output.metrics)
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
    trainer._fire("on_predict", metrics=output.metrics)
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
    args = trainer.args
    if prediction_loss_only is None:
        prediction_loss_only = args.prediction_loss_only
    model = model_for_eval(trainer)
    model.eval()
    optimizer: Any = trainer.optimizer  # schedule-free optimizers have eval()/train()
    if hasattr(optimizer, "eval") and callable(optimizer.eval):
        optimizer.eval()
    trainer.callback_handler.eval_dataloader = dataloader
    include = set(args.include_for_metrics or [])
    gatherer = EvalGatherer(
        trainer.runtime,
        offload_every=args.eval_accumulation_steps or 1,
        # with batch_eval_metrics only predict() keeps what it predicted (evaluate needs metrics)
        keep_outputs=not prediction_loss_only
        and (not args.batch_eval_metrics or description == "Prediction"),
        do_concat=args.eval_do_concat_batches,
        by_batch=deals_whole_batches(dataloader),
    )
    batch_metrics = args.batch_eval_metrics and trainer.compute_metrics is not None
    num_batches = len(dataloader) if data_utils.has_length(dataloader) else None
    metrics: dict[str, Any] = {}
    for step, inputs, rows, samples in _real_batches(trainer, dataloader, num_batches):
        loss, logits, labels = trainer.prediction_step(
            model, inputs, prediction_loss_only, ignore_keys=ignore_keys
        )
        if samples == 0:  # a sharded model's forward is collective: it ran, its output is dropped
            continue
        if logits is not None and trainer.preprocess_logits_for_metrics is not None:
            logits = trainer.preprocess_logits_for_metrics(logits, labels)
        model_inputs = (
            inputs.get("input_ids") if "inputs" in include and isinstance(inputs, Mapping) else None
        )
        gatherer.add(
            loss=loss, samples=samples, rows=rows, predictions=logits, labels=labels, inputs=model_inputs
        )
        if batch_metrics and logits is not None and labels is not None:
            assert trainer.compute_metrics is not None  # batch_metrics checks it
            metrics = trainer.compute_metrics(
                EvalPrediction(predictions=logits, label_ids=labels, inputs=model_inputs),
                compute_result=num_batches is not None and step == num_batches - 1,
            )
        trainer._fire("on_prediction_step")
    num_samples = (
        trainer.num_examples(dataloader)
        if data_utils.has_length(getattr(dataloader, "dataset", None))
        else None
    )
    result = gatherer.finish()  # the samples evaluated: the sampler's repeats were cut before the forward
    if not batch_metrics:
        metrics = _metrics_of(trainer, result, include) or metrics
    metrics = denumpify_detensorize(dict(metrics or {}))
    if result.loss is not None:
        metrics["loss"] = result.loss
    for key in list(metrics):
        if not key.startswith(f"{metric_key_prefix}_"):
            metrics[f"{metric_key_prefix}_{key}"] = metrics.pop(key)
    return EvalLoopOutput(
        predictions=result.predictions,
        label_ids=result.label_ids,
        metrics=metrics,
        num_samples=num_samples if num_samples is not None else result.num_samples,
    )


def _real_batches(trainer: PredictionTrainer, dataloader: Any, num_batches: int | None) -> Iterator[tuple]:
    """(step, batch, rows, samples) of the loader, cut to its real samples: samples the sampler
    repeated to even out processes are cut before the forward, so they weigh in neither the loss nor
    the metrics (a batch of only such samples is dropped, unless every process must run the forward:
    a sharded model). A batch's samples are what the sampler put in it, not its rows: a collator may
    give several rows per sample (preference pairs). The loop's own evaluation stops at a preemption
    (checked before every batch; with several processes a collective, so only where every process
    has the same number of batches: a sized loader)."""
    run, runtime = trainer._run, trainer.runtime
    stop = run is not None and run.eval_stops_on_preemption
    # even_batches=False may leave processes with different numbers of batches: no collective then
    stop = stop and (
        not runtime.distributed
        or (num_batches is not None and len(set(runtime.all_gather_object(num_batches))) == 1)
    )
    collective = run is not None and run.engine.collective_forward
    counter = _SampleCounter(dataloader)
    for step, inputs in enumerate(dataloader):
        if stop and run is not None and run.preempted():
            signal_name = getattr(run.preemption.requested, "name", "a preemption signal")
            raise EvaluationPreempted(
                f"Evaluation stopped by {signal_name} after {step} of {num_batches or '?'} batches"
            )
        rows = batch_size(inputs)
        first, samples, keep = counter.count(rows, getattr(dataloader, "real_rows_in_batch", None))
        if keep < samples:
            if keep == 0 and not collective:
                continue
            if keep:
                inputs, rows = _first_samples(dataloader, inputs, rows, samples, first, keep)
        yield step, inputs, rows if keep else 0, keep


class _SampleCounter:
    """Samples per evaluation batch: from the sampler's geometry when trainwright's sampler cuts the
    batches (each holds `batch_size` samples but the last), else the batch's rows; and how many of
    them are real (not the sampler's repeats)."""

    def __init__(self, dataloader: Any) -> None:
        self.geometry = data_utils.sampler_geometry(dataloader)
        self.real = rows_to_keep(dataloader)
        self.dealt = 0

    def count(self, rows: int, real_in_batch: int | None) -> tuple[int, int, int]:
        """(position of this batch's first sample, samples in it, real ones among them)."""
        geometry, first = self.geometry, self.dealt
        samples = min(geometry[0], geometry[1] - first) if geometry else rows
        if real_in_batch is not None:  # a dispatched last batch says it itself
            self.real = first + real_in_batch
        self.dealt += samples
        if self.real is None or self.dealt <= self.real:
            return first, samples, samples
        return first, samples, max(self.real - first, 0)


def _first_samples(
    dataloader: Any, inputs: Any, rows: int, samples: int, first: int, keep: int
) -> tuple[Any, int]:
    """The batch of its first `keep` samples, and its rows: its first rows where a sample is a row;
    else (a collator giving several rows per sample) those samples collated again, from the
    sampler's order, since which rows belong to a sample is the collator's layout."""
    if rows == samples:
        return take_rows(inputs, keep), keep
    sampler: Any = getattr(dataloader, "sampler", None)
    if not callable(getattr(sampler, "rank_order", None)):
        raise ValueError(
            f"Evaluation: a batch of {samples} samples came as {rows} rows, {samples - keep} of its samples "
            "repeated to even out processes, and its loader cannot give its samples again to leave those "
            "out. Evaluate with accelerator_config={'even_batches': False} (no repeats)."
        )
    indices = sampler.rank_order()[first : first + keep]
    batch = dataloader.collate_fn([dataloader.dataset[i] for i in indices])
    return batch, batch_size(batch)


def _metrics_of(trainer: PredictionTrainer, result: Any, include: set[str]) -> dict[str, Any] | None:
    """`compute_metrics` over the whole evaluation's predictions (None without them)."""
    if trainer.compute_metrics is None or result.predictions is None or result.label_ids is None:
        return None
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
    loss_without_labels = bool(return_loss) if return_loss is not None else trainer.can_return_loss
    inputs = trainer._prepare_inputs(inputs)
    if ignore_keys is None:
        config = getattr(model, "config", None)
        ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", ["past_key_values"]) or [])
    labels = None
    logits: Any
    if has_labels:
        found = tuple(nested_detach(inputs.get(name)) for name in trainer.label_names)
        labels = found[0] if len(found) == 1 else found
    with torch.no_grad(), trainer.compute_loss_context_manager():
        if has_labels or loss_without_labels:
            if prediction_loss_only and liger.is_applied(model):  # Liger skips the logits (upstream)
                inputs = {**inputs, "skip_logits": True}
            with fused_loss.loss_only(prediction_loss_only):  # then the fused loss may skip the logits
                loss, outputs = trainer.compute_loss(model, inputs, return_outputs=True)
            loss = loss.detach().mean()
            skip = set(ignore_keys) | {"loss"}
            if isinstance(outputs, dict):
                logits = tuple(v for k, v in outputs.items() if k not in skip)
            else:
                logits = outputs[1:] if isinstance(outputs, (tuple, list)) else ()
        else:
            loss = None
            outputs = model(**inputs)
            if isinstance(outputs, dict):
                logits = tuple(v for k, v in outputs.items() if k not in set(ignore_keys))
            else:
                logits = outputs
    if prediction_loss_only:
        return loss, None, None
    logits = nested_detach(logits)
    if isinstance(logits, (tuple, list)) and len(logits) == 1:
        logits = logits[0]
    if isinstance(logits, (tuple, list)) and len(logits) == 0:
        logits = None
    return loss, logits, labels


def nested_detach(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return type(x)(nested_detach(t) for t in x)
    if isinstance(x, Mapping):
        return same_mapping(x, {k: nested_detach(v) for k, v in x.items()})
    return x.detach() if isinstance(x, torch.Tensor) else x


def rows_to_keep(dataloader: Any) -> int | None:
    """How many of this process's evaluation rows are real samples (None when none are padding)."""
    sampler: Any = getattr(dataloader, "sampler", None)
    if not getattr(sampler, "num_padding", 0):
        return None
    return int(sampler.num_real)


def deals_whole_batches(dataloader: Any) -> bool:
    """Whether each process's batch is a contiguous slice of a global batch (accelerator_config's
    split_batches or dispatch_batches) rather than every N-th sample: results are then put back
    in order batch by batch."""
    sampler: Any = getattr(dataloader, "sampler", None)
    dataset: Any = getattr(dataloader, "dataset", None)
    return bool(
        getattr(dataloader, "deals_whole_batches", False)
        or getattr(dataset, "deals_whole_batches", False)
        or getattr(sampler, "block", 1) > 1
    )


def take_rows(inputs: Any, keep: int) -> Any:
    """The first `keep` samples of a batch (tensors with a batch dimension are sliced; a padding-free
    row is cut after its `keep`-th sample)."""
    if isinstance(inputs, Mapping) and (packed := packing.take_samples(inputs, keep)) is not None:
        return same_mapping(inputs, packed)
    if isinstance(inputs, Mapping):
        return same_mapping(inputs, {k: take_rows(v, keep) for k, v in inputs.items()})
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(take_rows(v, keep) for v in inputs)
    if isinstance(inputs, torch.Tensor) and inputs.dim() > 0:
        return inputs[:keep]
    return inputs

"""Evaluation and prediction: `evaluate`, `predict`, the evaluation loop and one prediction step.

The Trainer's methods of these names call in here with the values they read of the Trainer, taken
at the call, and its upstream hooks bound (`get_eval_dataloader`, `evaluation_loop`,
`prediction_step`, `num_examples`, `log`, `compute_loss`, ...), so a subclass that overrides one is
still called where upstream calls it. Nothing here holds or names the Trainer.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import torch
from torch import nn

from trainwright import data as data_utils
from trainwright.args.training_args import TrainingArguments
from trainwright.core.events import CallbackHandler
from trainwright.core.nested import detach
from trainwright.core.runtime import Runtime
from trainwright.core.state import TrainerState
from trainwright.distributed import collectives
from trainwright.loop.eval.batches import deals_whole_batches, real_batches
from trainwright.loop.eval.gather import EvalGatherer, EvalResult
from trainwright.loop.eval.loop import Evaluation
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


class EvaluationPreempted(Exception):
    """A preemption signal stopped the in-training evaluation; the checkpoint is written instead."""


def evaluate_each(
    evaluate: Callable[..., dict[str, float]],
    datasets: dict[str, Any],
    given: bool,
    ignore_keys: list[str] | None,
    metric_key_prefix: str,
) -> dict[str, float]:
    """A dict of datasets evaluated one by one through `evaluate` (the Trainer's, bound), each one's
    metrics prefixed `<prefix>_<name>_`; the trainer's own are named, so each keeps its loader."""
    metrics: dict[str, float] = {}
    for name, dataset in datasets.items():
        metrics.update(
            evaluate(
                eval_dataset=dataset if given else name,
                ignore_keys=ignore_keys,
                metric_key_prefix=f"{metric_key_prefix}_{name}",
            )
        )
    return metrics


@dataclass(frozen=True)
class PredictionCall:
    """One `evaluate()` / `predict()` call: the values it reads of the Trainer, taken at the call, and
    the upstream hooks it calls, bound (`get_eval_dataloader` or `get_test_dataloader`,
    `evaluation_loop`, `log`), so a subclass's overrides run."""

    args: TrainingArguments
    runtime: Runtime
    state: TrainerState
    memory: TrainerMemoryTracker
    in_train: bool  # during train(): an empty evaluation the best-model choice reads is refused
    metric_key: str  # the key metric_for_best_model names (`eval_<name>`)
    loader: Callable[[Any], Any]
    loop: Callable[..., EvalLoopOutput]
    fire: Callable[..., None]  # an event to the callbacks, with the Trainer's state and control
    log: Callable[[dict[str, float]], None]

    def evaluate(
        self, eval_dataset: Any, ignore_keys: list[str] | None, prefix: str, loss_only: bool | None
    ) -> dict[str, float]:
        """Evaluate one dataset (`loss_only`: True where there is no `compute_metrics`)."""
        self.memory.start("eval")
        dataloader = self.loader(eval_dataset)
        start = time.time()
        output = self.loop(
            dataloader,
            description="Evaluation",
            prediction_loss_only=loss_only,
            ignore_keys=ignore_keys,
            metric_key_prefix=prefix,
        )
        self._finish(output, dataloader, "eval_dataset", prefix, start)
        self.log(output.metrics)
        self.fire("on_evaluate", extra={"metrics": output.metrics})
        self.memory.stop_and_update_metrics("eval", output.metrics)
        return output.metrics

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None, prefix: str) -> PredictionOutput:
        """Predictions (padded with -100 across batches), labels and metrics for a dataset."""
        self.memory.start("test")
        dataloader = self.loader(test_dataset)
        start = time.time()
        output = self.loop(
            dataloader, description="Prediction", ignore_keys=ignore_keys, metric_key_prefix=prefix
        )
        self._finish(output, dataloader, "test_dataset", prefix, start)
        self.fire("on_predict", extra={"metrics": output.metrics})
        self.memory.stop_and_update_metrics("test", output.metrics)
        return PredictionOutput(
            predictions=output.predictions, label_ids=output.label_ids, metrics=output.metrics
        )

    def _finish(self, output: EvalLoopOutput, dataloader: Any, name: str, prefix: str, start: float) -> None:
        if output.num_samples == 0:
            self._no_samples(dataloader, name, prefix)
        batches = math.ceil(
            output.num_samples / (self.args.per_device_eval_batch_size * self.runtime.data_world_size)
        )
        output.metrics.update(speed_metrics(prefix, start, num_samples=output.num_samples, num_steps=batches))

    def _no_samples(self, dataloader: Any, name: str, prefix: str) -> None:
        """Warn that the dataset gave no samples (upstream returns its metrics silently); during
        training with `metric_for_best_model` on this evaluation's keys, refuse with the reason."""
        kind = type(getattr(dataloader, "dataset", None)).__name__
        message = f"{name} ({kind}) gave no samples: its metrics hold timings only (no {prefix}_loss)"
        key, chosen = self.metric_key, self.args.metric_for_best_model
        if self.in_train and chosen is not None and key.startswith(f"{prefix}_"):
            raise ValueError(
                f"{message}, and metric_for_best_model={chosen!r} needs {key!r} "
                f"at step {self.state.global_step}. Give {name} samples."
            )
        logger.warning("%s.", message)


@dataclass(frozen=True)
class LoopCall:
    """One `evaluation_loop` call: the values it reads of the Trainer, taken at the call, and the
    upstream hooks it calls, bound (`prediction_step`, `num_examples`). `preempted` is the run's
    check while the loop's own evaluation runs (None otherwise); `collective` whether the run's
    engine needs every process in each forward."""

    args: TrainingArguments
    runtime: Runtime
    model: nn.Module
    optimizer: Any
    callback_handler: CallbackHandler
    in_train: bool
    compute_metrics: Callable[..., dict] | None
    preprocess: Callable | None  # preprocess_logits_for_metrics
    step: Callable[..., Any]  # prediction_step
    num_examples: Callable[[Any], int]
    fire: Callable[..., None]
    collective: bool = False
    preempted: Callable[[], bool] | None = None
    preemption: Any = None  # the run's PreemptionGuard: the signal that arrived

    def run(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None,
        ignore_keys: list[str] | None,
        metric_key_prefix: str,
    ) -> EvalLoopOutput:
        """Run `prediction_step` over a dataloader, streaming results to the CPU."""
        loss_only = self.args.prediction_loss_only if prediction_loss_only is None else prediction_loss_only
        model = self._model()
        model.eval()
        optimizer: Any = self.optimizer  # schedule-free optimizers have eval()/train()
        if hasattr(optimizer, "eval") and callable(optimizer.eval):
            optimizer.eval()
        self.callback_handler.eval_dataloader = dataloader
        evaluation = self.build(model, dataloader, description, loss_only, ignore_keys)
        # mixed precision: float32 outputs, as from upstream's prepared forward (train() holds them already)
        mixed = (self.args.bf16 or self.args.fp16) and not self.in_train
        with collectives.float32_outputs(model) if mixed else contextlib.nullcontext():
            # the samples evaluated: the sampler's repeats cut before the forward
            result, metrics = evaluation.run()
        if evaluation.batch_metrics is None:
            metrics = self._metrics_of(result) or metrics
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
            num_samples=self.num_examples(dataloader) if counted else result.num_samples,
        )

    def _model(self) -> nn.Module:
        args = self.args
        if not self.in_train and (args.fp16_full_eval or args.bf16_full_eval):
            dtype = torch.float16 if args.fp16_full_eval else torch.bfloat16
            return self.model.to(dtype=dtype, device=self.runtime.device)
        return self.model

    def build(
        self,
        model: nn.Module,
        dataloader: Any,
        description: str,
        loss_only: bool,
        ignore_keys: list[str] | None,
    ) -> Evaluation:
        """One evaluation's component, every choice made here: outputs kept or not, metrics per batch
        or at the end, the model's inputs kept for metrics, a collective forward, the stop check."""
        args, step = self.args, self.step
        num_batches = len(dataloader) if data_utils.has_length(dataloader) else None
        gatherer = EvalGatherer(
            self.runtime,
            offload_every=args.eval_accumulation_steps or 1,
            # with batch_eval_metrics only predict() keeps what it predicted (evaluate needs metrics)
            keep_outputs=not loss_only and (not args.batch_eval_metrics or description == "Prediction"),
            do_concat=args.eval_do_concat_batches,
            by_batch=deals_whole_batches(dataloader),
        )
        return Evaluation(
            # positional as upstream calls it: a subclass may name the flag otherwise
            step=lambda inputs: step(model, inputs, loss_only, ignore_keys=ignore_keys),
            batches=real_batches(dataloader, self._stop_check(num_batches), collective=self.collective),
            gatherer=gatherer,
            on_step=partial(self.fire, "on_prediction_step"),
            preprocess=self.preprocess,
            batch_metrics=self.compute_metrics if args.batch_eval_metrics else None,
            last_batch=None if num_batches is None else num_batches - 1,
            keep_inputs="inputs" in (args.include_for_metrics or []),
        )

    def _stop_check(self, num_batches: int | None) -> Callable[[int], None] | None:
        """The loop's own evaluation stops at a preemption: checked before every batch; with several
        processes a collective, so only where every process has the same number of batches (a sized
        loader: even_batches=False may leave them different)."""
        preempted, runtime = self.preempted, self.runtime
        if preempted is None:
            return None
        if runtime.distributed and (
            num_batches is None or len(set(runtime.all_gather_object(num_batches))) != 1
        ):
            return None
        preemption = self.preemption

        def check(index: int) -> None:
            if preempted():
                signal_name = getattr(getattr(preemption, "requested", None), "name", "a preemption signal")
                raise EvaluationPreempted(
                    f"Evaluation stopped by {signal_name} after {index} of {num_batches or '?'} batches"
                )

        return check

    def _metrics_of(self, result: EvalResult) -> dict[str, Any] | None:
        """`compute_metrics` over the whole evaluation's predictions (None without them)."""
        if self.compute_metrics is None or result.predictions is None or result.label_ids is None:
            return None
        include = set(self.args.include_for_metrics or [])
        return self.compute_metrics(
            EvalPrediction(
                predictions=result.predictions,
                label_ids=result.label_ids,
                inputs=result.inputs if "inputs" in include else None,
                losses=result.losses if "loss" in include else None,
            )
        )


def prediction_step(
    model: nn.Module,
    inputs: dict[str, Any],
    prediction_loss_only: bool,
    ignore_keys: list[str] | None,
    label_names: list[str],
    can_return_loss: bool,
    prepare_inputs: Callable[[Any], Any],
    compute_loss: Callable[..., Any],
    loss_context: Callable[[], Any],
) -> tuple[torch.Tensor | None, Any, Any]:
    """(loss, logits, labels) for one batch, without gradients. The Trainer's values and hooks at the
    call: its `label_names`, `can_return_loss`, and `_prepare_inputs`, `compute_loss`,
    `compute_loss_context_manager` bound (a subclass's overrides run)."""
    has_labels = bool(label_names) and all(inputs.get(k) is not None for k in label_names)
    return_loss = inputs.get("return_loss")
    # as upstream: a loss without labels only where there are no label names (TRL's reward trainer
    # empties them); a batch missing its named labels is predicted without a loss
    loss_without_labels = not label_names and (
        bool(return_loss) if return_loss is not None else can_return_loss
    )
    inputs = prepare_inputs(inputs)
    if ignore_keys is None:
        config = getattr(model, "config", None)
        ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", [cache_output_key()]) or [])
    labels = None
    if has_labels or loss_without_labels:
        # without label names the labels are an empty tuple, not None: `compute_metrics` is still called
        found = tuple(detach(inputs.get(name)) for name in label_names)
        labels = found[0] if len(found) == 1 else found
    loss = None
    with torch.no_grad(), loss_context():
        if has_labels or loss_without_labels:
            with fused_loss.loss_only(prediction_loss_only):  # then the fused loss may skip the logits
                loss, outputs = compute_loss(
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

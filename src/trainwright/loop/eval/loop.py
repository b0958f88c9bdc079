"""`Evaluation`: one `evaluation_loop` call as a component, as `Checkpointer` is for saves.

It is built once per call (`prediction.build_evaluation`) from what it needs, never the Trainer:
the per-batch step (the Trainer's `prediction_step`, the upstream hook, bound to the model and the
call's arguments), the batches cut to their real samples with the stop check in them
(`batches.real_batches`), the gatherer of outputs, and what is decided once: logits
preprocessed or not, metrics per batch or at the end, the model's inputs kept for metrics or not.
`run()` is the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainwright.loop.eval.gather import EvalGatherer, EvalResult
from trainwright.observe.metrics import EvalPrediction


@dataclass
class Evaluation:
    """One evaluation's loop and the decisions taken before it (see the module docstring)."""

    step: Callable[[Any], tuple[Any, Any, Any]]  # a batch -> (loss, logits, labels)
    batches: Iterable[tuple[int, Any, int, int]]  # (index, batch, rows, samples)
    gatherer: EvalGatherer
    on_step: Callable[[], None]  # the on_prediction_step event
    preprocess: Callable[[Any, Any], Any] | None = None  # preprocess_logits_for_metrics
    batch_metrics: Callable[..., dict] | None = None  # compute_metrics, with batch_eval_metrics
    last_batch: int | None = None  # the last batch's index, where the loader has a length
    keep_inputs: bool = False  # include_for_metrics holds "inputs"

    def run(self) -> tuple[EvalResult, dict[str, Any]]:
        """Every batch through the step into the gatherer; (the gathered result, batch metrics)."""
        metrics: dict[str, Any] = {}
        for index, inputs, rows, samples in self.batches:
            loss, logits, labels = self.step(inputs)
            if samples == 0:  # a sharded model's forward is collective: it ran, its output is dropped
                continue
            if logits is not None and self.preprocess is not None:
                logits = self.preprocess(logits, labels)
            model_inputs = (
                inputs.get("input_ids") if self.keep_inputs and isinstance(inputs, Mapping) else None
            )
            self.gatherer.add(
                loss=loss, samples=samples, rows=rows, predictions=logits, labels=labels, inputs=model_inputs
            )
            if self.batch_metrics is not None and logits is not None and labels is not None:
                prediction = EvalPrediction(predictions=logits, label_ids=labels, inputs=model_inputs)
                metrics = self.batch_metrics(prediction, compute_result=index == self.last_batch)
            self.on_step()
        return self.gatherer.finish(), metrics

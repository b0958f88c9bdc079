"""Seq2SeqTrainer: evaluation and prediction with `generate` (predict_with_generate)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .trainer import Trainer


class Seq2SeqTrainer(Trainer):
    """A Trainer whose evaluate/predict can return generated token ids instead of logits.

    Generation settings come from `gen_kwargs` given to evaluate/predict, else from
    `generation_max_length` / `generation_num_beams` / `generation_config` of the arguments.
    """

    def evaluate(
        self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", **gen_kwargs: Any
    ):
        self._gen_kwargs = self._generation_kwargs(gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test", **gen_kwargs: Any):
        self._gen_kwargs = self._generation_kwargs(gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def _generation_kwargs(self, given: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(given)
        if kwargs.get("max_length") is None and kwargs.get("max_new_tokens") is None:
            if getattr(self.args, "generation_max_length", None) is not None:
                kwargs["max_length"] = self.args.generation_max_length
        if kwargs.get("num_beams") is None and getattr(self.args, "generation_num_beams", None) is not None:
            kwargs["num_beams"] = self.args.generation_num_beams
        config = getattr(self.args, "generation_config", None)
        if config is not None and "generation_config" not in kwargs:
            kwargs["generation_config"] = config
        return kwargs

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
        **gen_kwargs: Any,
    ):
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if not hasattr(model, "generate"):
            raise TypeError(
                f"predict_with_generate needs a model with .generate(); {type(model).__name__} has none."
            )
        kwargs = {**getattr(self, "_gen_kwargs", {}), **gen_kwargs}
        has_labels = "labels" in inputs
        inputs = self._prepare_inputs(inputs)
        generation_inputs = {k: v for k, v in inputs.items() if k not in ("labels", "decoder_input_ids")}
        with torch.no_grad():
            generated = model.generate(**generation_inputs, **kwargs)
            loss = None
            if has_labels:
                with self.runtime.autocast(self._amp_dtype(evaluating=True)):
                    loss = self.compute_loss(model, inputs).detach().mean()
        labels = inputs["labels"] if has_labels else None
        return loss, generated, labels

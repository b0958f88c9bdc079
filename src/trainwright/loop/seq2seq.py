"""Seq2SeqTrainer: evaluation and prediction with `generate` (predict_with_generate)."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from trainwright.loop.trainer import Trainer


class Seq2SeqTrainer(Trainer):
    """A Trainer whose evaluate/predict can return generated token ids instead of logits.

    Generation settings come from `gen_kwargs` given to evaluate/predict, else from
    `generation_max_length` / `generation_num_beams` of the arguments; `generation_config` (a
    GenerationConfig, a dict of its fields, a folder or a JSON file) replaces the model's own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = getattr(self.args, "generation_config", None)
        if config is not None:
            self.model.generation_config = self.load_generation_config(config)

    @staticmethod
    def load_generation_config(gen_config_arg: Any) -> Any:
        """A validated `GenerationConfig` from a GenerationConfig, a dict, a folder or a file."""
        from transformers import GenerationConfig

        if isinstance(gen_config_arg, GenerationConfig):
            config = copy.deepcopy(gen_config_arg)
        elif isinstance(gen_config_arg, Mapping):
            config = GenerationConfig(**gen_config_arg)
        elif isinstance(gen_config_arg, (str, os.PathLike)):
            path = Path(gen_config_arg)
            if path.is_file():
                config = GenerationConfig.from_pretrained(path.parent, path.name)
            elif path.is_dir():
                config = GenerationConfig.from_pretrained(path)
            else:
                raise FileNotFoundError(
                    f"generation_config={os.fspath(gen_config_arg)!r} is neither a file nor a folder; give a "
                    "generation_config.json (or its folder), a dict of GenerationConfig fields, or a "
                    "GenerationConfig (nothing is downloaded)."
                )
        else:
            raise TypeError(
                "generation_config must be a GenerationConfig, a dict, or a path, got "
                f"{type(gen_config_arg).__name__}."
            )
        try:
            config.validate(strict=True)
        except ValueError as exc:
            raise ValueError(f"generation_config: {exc}\n\nFix these issues to train your model.") from exc
        return config

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
        # Seq2SeqTrainingArguments' fields; plain TrainingArguments have neither
        if kwargs.get("max_length") is None and kwargs.get("max_new_tokens") is None:
            if (max_length := getattr(self.args, "generation_max_length", None)) is not None:
                kwargs["max_length"] = max_length
        if (
            kwargs.get("num_beams") is None
            and (num_beams := getattr(self.args, "generation_num_beams", None)) is not None
        ):
            kwargs["num_beams"] = num_beams
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
        if not gen_kwargs:
            gen_kwargs = dict(getattr(self, "_gen_kwargs", {}))
        gen_kwargs = {
            k: v for k, v in gen_kwargs.items() if not (k in ("num_beams", "max_length") and v is None)
        }
        has_labels = "labels" in inputs
        inputs = self._prepare_inputs(inputs)
        generation_inputs = dict(inputs)
        labels, decoder_ids = inputs.get("labels"), inputs.get("decoder_input_ids")
        if labels is not None and decoder_ids is not None and labels.shape == decoder_ids.shape:
            # decoder inputs made from the labels (teacher forcing) would leak the answer into generate
            generation_inputs.pop("decoder_input_ids")
            generation_inputs.pop("decoder_attention_mask", None)
        generation_inputs.pop("labels", None)
        with torch.no_grad():
            generated = cast(Any, model).generate(**generation_inputs, **gen_kwargs)  # has it (checked above)
            loss = None
            if has_labels:
                with self.compute_loss_context_manager():
                    outputs = model(**inputs)
                if self.label_smoother is not None:
                    loss = self.label_smoother(outputs, inputs["labels"]).detach().mean()
                else:
                    loss = (outputs["loss"] if isinstance(outputs, Mapping) else outputs[0]).detach().mean()
        if self.args.prediction_loss_only:
            return loss, None, None
        width = self._generation_width(model, gen_kwargs)
        generated = (
            self._pad_tensors_to_max_len(generated, width) if generated.shape[-1] < width else generated
        )
        labels = inputs["labels"] if has_labels else None
        if labels is not None and labels.shape[-1] < width:
            labels = self._pad_tensors_to_max_len(labels, width)
        return loss, generated, labels

    @staticmethod
    def _generation_width(model: nn.Module, gen_kwargs: dict[str, Any]) -> int:
        """The width generated ids are padded to, so batches concatenate: the max_length (or
        max_new_tokens + 1) this call asked for, else the model's generation config's (upstream pads
        to the model's config even when the call asked for less; the call's request is what a
        user means)."""
        if gen_kwargs.get("max_length") is not None:
            return int(gen_kwargs["max_length"])
        if gen_kwargs.get("max_new_tokens") is not None:
            return int(gen_kwargs["max_new_tokens"]) + 1
        config: Any = getattr(model, "generation_config", None)
        if getattr(config, "max_new_tokens", None) is not None:
            return config.max_new_tokens + 1
        if getattr(config, "max_length", None) is not None:
            return config.max_length
        defaults = (
            config._get_default_generation_params()
            if hasattr(config, "_get_default_generation_params")
            else {}
        )
        return int(defaults.get("max_length", 20))  # what generate falls back to

    def _pad_tensors_to_max_len(self, tensor: torch.Tensor, max_length: int) -> torch.Tensor:
        """Right-pad token ids to `max_length` with the tokenizer's (else the model's) pad id."""
        tokenizer = self.processing_class
        pad_id = None
        if tokenizer is not None and hasattr(tokenizer, "pad_token_id"):
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            pad_id = getattr(getattr(self.model, "config", None), "pad_token_id", None)
        if pad_id is None:
            raise ValueError(
                "predict_with_generate pads generated ids to one length: set pad_token_id in the model's "
                "config or pass a tokenizer with a pad token as processing_class."
            )
        padded = torch.full((tensor.shape[0], max_length), pad_id, dtype=tensor.dtype, device=tensor.device)
        padded[:, : tensor.shape[-1]] = tensor
        return padded

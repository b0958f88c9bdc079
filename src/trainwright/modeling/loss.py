"""The loss contract behind gradient accumulation, and label smoothing.

Rule: one optimizer step must give the update of one batch made of all its micro-batches (and of
all processes). Items are the targets a loss averages over: label tokens that are not -100
(counting ``labels[..., 1:]`` for a causal LM, whose position 0 is never a target), or samples
when the batch carries no labels. With N the items of the whole step (summed over processes) and
n those of one micro-batch:

- a model that uses ``num_items_in_batch`` and a ``compute_loss_func`` get N and must return
  ``sum of item losses / N``; trainwright uses that loss as it is. A model uses it when it says so
  (``accepts_loss_kwargs = True``, or an explicit ``num_items_in_batch`` forward argument). A
  forward that only takes ``**kwargs`` may route them into its loss (transformers' causal LMs do)
  or drop them (BERT, BART, T5 heads with their own ``CrossEntropyLoss``): that is measured once
  per ``train()`` by :func:`loss_honours_num_items` on the first micro-batch;
- any other loss is taken to be a mean over its micro-batch's items and is weighted by ``n / N``
  (``mean * n / N = sum / N``, the same update);
- a Trainer subclass that sets ``loss_is_scaled_for_ga = True`` takes responsibility itself.

Which of the two a loss is follows from declared facts alone (:func:`loss_divides_by_items`), decided
once per run (``step_weights.StepWeights``) from the facts ``compute_loss`` reads to pass N, as
upstream's ``model_accepts_loss_kwargs`` rule: a ``compute_loss`` override is scaled by that rule too.

Under DDP the loss is then multiplied by the world size, since DDP averages gradients.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trainwright.core.modules import is_peft_model, unwrap_model


def model_accepts_loss_kwargs(model: torch.nn.Module) -> bool | None:
    """Whether the model's forward uses ``num_items_in_batch``: True or False when the model says
    so, None when only a ``**kwargs`` says it might (see :func:`loss_honours_num_items`)."""
    declared = getattr(model, "accepts_loss_kwargs", None)
    if declared is not None:
        return bool(declared)
    params = inspect.signature(model.forward).parameters
    if "num_items_in_batch" in params:
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return False


@dataclass
class LossFacts:
    """What the loss contract needs to know of one model: whether its loss divides by
    ``num_items_in_batch`` (and whether that is still to be measured, for a ``**kwargs`` forward),
    and whether its labels are shifted inside its loss (a causal LM)."""

    accepts_loss_kwargs: bool
    probe: bool
    label_shift: bool

    @classmethod
    def of(cls, model: torch.nn.Module) -> LossFacts:
        detected = model_accepts_loss_kwargs(model)
        # a **kwargs forward: upstream's reading (it takes them) until measured
        return cls(detected is not False, detected is None, label_shift_for(model))


def loss_divides_by_items(*, accepts_loss_kwargs: bool, custom_loss: bool) -> bool:
    """Whether a labelled micro-batch's loss is already ``sum / N`` (N: the step's items): its labels
    go to a ``compute_loss_func`` or the label smoother (``custom_loss``), which get N, or to a model
    whose loss takes N. Otherwise it is a mean over the micro-batch, weighted by its share of N."""
    return custom_loss or accepts_loss_kwargs


def _loss_of(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    if isinstance(outputs, (tuple, list)):
        return outputs[0] if outputs else None
    return outputs if isinstance(outputs, torch.Tensor) else None


def loss_honours_num_items(
    model: torch.nn.Module, inputs: Mapping[str, Any], num_items: torch.Tensor
) -> bool:
    """Measure whether ``model(**inputs, num_items_in_batch=N)`` returns ``sum / N``.

    Two forwards without gradients in eval mode (no dropout, no running-statistics update), with
    N and 2N: a loss that honours N halves. The model's mode and every RNG are left as they were,
    so training (and an exact resume) is unaffected. A forward that rejects the argument, or a
    loss that is not a finite non-zero scalar, counts as not honouring it: the mean is then
    weighted, which is right for any mean loss.
    """
    was_training = model.training
    device = num_items.device
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            losses = []
            for n in (num_items, num_items * 2):
                loss = _loss_of(model(**inputs, num_items_in_batch=n))
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    return False
                losses.append(float(loss.float()))
    except (TypeError, ValueError):
        return False
    finally:
        model.train(was_training)
    first, second = losses
    if not (math.isfinite(first) and math.isfinite(second)) or second == 0.0:
        return False
    return first / second > 1.5


def count_items(
    inputs: Mapping[str, Any], *, shift: bool, label_name: str = "labels", ignore_index: int = -100
) -> torch.Tensor:
    """Label targets the loss averages over, as a tensor on the labels' device (no host sync).

    ``shift=True`` for a causal LM: it predicts token ``t+1`` from position ``t``, so the first
    label of each sequence is never a target. A batch that carries transformers' ``shift_labels``
    (labels already moved by one: a padding-free collator's, or a sequence shard of context
    parallelism) is counted on them as given, as upstream counts them: the loss uses them instead.
    """
    labels = inputs.get(label_name) if isinstance(inputs, Mapping) else None
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"count_items: the batch has no tensor {label_name!r} (keys: {list(inputs)}).")
    shifted = inputs.get("shift_labels") if label_name == "labels" else None
    if isinstance(shifted, torch.Tensor):
        labels = shifted
    elif shift:
        labels = labels[..., 1:]
    return (labels != ignore_index).sum()


_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def is_causal_lm(model: Any) -> bool:
    """Whether the model's labels are shifted inside its loss (next-token prediction).

    A custom module states it with the attribute ``label_shift = True`` (trainwright's contract;
    ``False`` overrides the guesses below). Otherwise: a transformers class named
    ``*ForCausalLM`` / ``*LMHeadModel``, a ``loss_type`` of "ForCausalLM", or a config that is a
    decoder without being encoder-decoder.
    """
    model = unwrap_model(model)
    declared = getattr(model, "label_shift", None)
    if declared is not None:
        return bool(declared)
    if type(model).__name__.endswith(_CAUSAL_SUFFIXES):
        return True
    config = getattr(model, "config", None)
    if (
        getattr(model, "loss_type", None) == "ForCausalLM"
        or getattr(config, "loss_type", None) == "ForCausalLM"
    ):
        return True
    return bool(getattr(config, "is_decoder", False)) and not bool(
        getattr(config, "is_encoder_decoder", False)
    )


def items_in_batch(inputs: Mapping[str, Any], label_shift: bool) -> torch.Tensor:
    """Items one batch contributes to the loss: label targets, else samples."""
    labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
    if isinstance(labels, torch.Tensor):
        return count_items(inputs, shift=label_shift)
    return torch.tensor(batch_size(inputs))


def has_no_targets(inputs: Any, label_shift: bool) -> bool:
    """Whether a batch's integer labels are all ignored (-100): a mean loss over them is 0/0. Float
    labels (regression) always have targets: not counted, which would cost a step ~10 us on a CPU."""
    labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
    if isinstance(labels, torch.Tensor) and not labels.is_floating_point():
        return not bool(count_items(inputs, shift=label_shift))
    return False


def batch_size(inputs: Any) -> int:
    """Number of samples in a batch: the first dimension of its first tensor, or, for a packed
    batch (one row of concatenated sequences with ``position_ids``, as made by transformers'
    ``DataCollatorWithFlattening``), the number of sequences in it; a list of samples left
    uncollated (mappings), its length."""
    if isinstance(inputs, torch.Tensor):
        return inputs.shape[0] if inputs.dim() else 1
    values: Iterable[Any]
    if isinstance(inputs, Mapping):
        positions: Any = inputs.get("position_ids")
        packed = "attention_mask" not in inputs and isinstance(positions, torch.Tensor)
        if packed and positions.dim() == 2 and positions.shape[0] == 1:
            return int((positions == 0).sum()) or 1  # a packed row: its sequences start at 0
        values = inputs.values()
    elif isinstance(inputs, (list, tuple)):
        if inputs and all(isinstance(v, Mapping) for v in inputs):
            return len(inputs)  # the samples themselves, uncollated (TRL's GRPO batches)
        values = inputs
    else:
        return 1
    for v in values:
        if isinstance(v, (torch.Tensor, Mapping, list, tuple)):
            return batch_size(v)
    return 1


def label_shift_for(model: torch.nn.Module) -> bool:
    """Whether counting a batch's label targets drops each row's first label (the causal shift). Not
    for a PEFT prompt-learning causal LM that prepends virtual tokens (prompt tuning, P-tuning): the
    last virtual token predicts the first label, so every label is a target."""
    if prepends_virtual_tokens(model):
        return False
    return bool(getattr(model, "label_shift", False)) or is_causal_lm(model)


def prepends_virtual_tokens(model: Any) -> bool:
    """A PEFT model whose active adapter puts learned tokens before the inputs (and -100 before the
    labels): prompt learning other than prefix tuning, which passes its prefix as past keys instead."""
    model = unwrap_model(model)
    if not is_peft_model(model):
        return False
    config = model.peft_config.get(getattr(model, "active_adapter", "default"))
    kind = getattr(getattr(config, "peft_type", None), "value", None)
    return bool(getattr(config, "is_prompt_learning", False)) and kind != "PREFIX_TUNING"


class LabelSmoother:
    """Cross-entropy with label smoothing over non-ignored targets (labels == -100 ignored).

    Returns ``sum / num_items_in_batch`` when that is given, else the mean over targets, so it
    follows the accumulation contract above.
    """

    def __init__(self, epsilon: float = 0.1, ignore_index: int = -100):
        self.epsilon = epsilon
        self.ignore_index = ignore_index

    def __call__(
        self, model_output: Any, labels: torch.Tensor, shift_labels: bool = False, num_items_in_batch=None
    ) -> torch.Tensor:
        logits = model_output["logits"] if isinstance(model_output, Mapping) else model_output[0]
        if shift_labels:
            logits = logits[..., :-1, :].contiguous()
            labels = labels[..., 1:].contiguous()
        log_probs = -F.log_softmax(logits.float(), dim=-1)
        if labels.dim() == log_probs.dim() - 1:
            labels = labels.unsqueeze(-1)
        padding = labels.eq(self.ignore_index)
        safe = torch.clamp(labels, min=0)
        nll = log_probs.gather(dim=-1, index=safe).masked_fill(padding, 0.0)
        smoothed = log_probs.sum(dim=-1, keepdim=True, dtype=torch.float32).masked_fill(padding, 0.0)
        count = num_items_in_batch if num_items_in_batch is not None else (~padding).sum()
        nll_loss = nll.sum() / count
        smooth_loss = smoothed.sum() / (count * log_probs.shape[-1])
        return (1 - self.epsilon) * nll_loss + self.epsilon * smooth_loss

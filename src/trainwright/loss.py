"""The loss contract behind gradient accumulation, and label smoothing.

Rule: one optimizer step must give the update of one batch made of all its micro-batches (and of
all processes). Items are the targets a loss averages over: label tokens that are not -100
(counting ``labels[..., 1:]`` for a causal LM, whose position 0 is never a target), or samples
when the batch carries no labels. With N the items of the whole step (summed over processes) and
n those of one micro-batch:

- a model that takes ``num_items_in_batch`` (transformers models, or ``accepts_loss_kwargs = True``,
  or an explicit ``num_items_in_batch`` forward argument) and a ``compute_loss_func`` get N and
  must return ``sum of item losses / N``; trainwright uses that loss as it is;
- any other loss is taken to be a mean over its micro-batch's items and is weighted by ``n / N``;
- a Trainer subclass that sets ``loss_is_scaled_for_ga = True`` takes responsibility itself.

Under DDP the loss is then multiplied by the world size, since DDP averages gradients.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

from .data import count_items, is_causal_lm


def model_accepts_loss_kwargs(model: torch.nn.Module) -> bool:
    """Whether the model's forward uses ``num_items_in_batch`` (see the module docstring)."""
    declared = getattr(model, "accepts_loss_kwargs", None)
    if declared is not None:
        return bool(declared)
    params = inspect.signature(model.forward).parameters
    if "num_items_in_batch" in params:
        return True
    # transformers models route **kwargs into their shared loss functions; a plain module with
    # **kwargs usually ignores them, so it is not trusted to.
    is_pretrained = any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__)
    return is_pretrained and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def items_in_batch(inputs: dict[str, Any], label_shift: bool) -> torch.Tensor:
    """Items one batch contributes to the loss: label targets, else samples."""
    labels = inputs.get("labels") if isinstance(inputs, dict) else None
    if isinstance(labels, torch.Tensor):
        return count_items(inputs, shift=label_shift)
    return torch.tensor(batch_size(inputs))


def batch_size(inputs: Any) -> int:
    """Number of samples in a batch (first dimension of its first tensor)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.shape[0] if inputs.dim() else 1
    if isinstance(inputs, dict):
        values = inputs.values()
    elif isinstance(inputs, (list, tuple)):
        values = inputs
    else:
        return 1
    for v in values:
        if isinstance(v, (torch.Tensor, dict, list, tuple)):
            return batch_size(v)
    return 1


def label_shift_for(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "label_shift", False)) or is_causal_lm(model)


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
        logits = model_output["logits"] if isinstance(model_output, dict) else model_output[0]
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


class LossWindow:
    """Per-step training losses since the last log, kept on the device.

    A step's loss is kept as the (detached) tensor the step produced: recording it is a list
    append, with no tensor operation and no host sync on the hot path; the window is stacked and
    read once per log. Non-finite steps are left out of the logged mean when filtering
    (`logging_nan_inf_filter`), which is what replacing them by the running mean amounts to.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.steps: list[torch.Tensor] = []

    def add(self, step: int, loss: torch.Tensor) -> None:
        if step < len(self.steps):  # another micro-batch of the same optimizer step
            self.steps[step] = self.steps[step] + loss
        else:
            self.steps.append(loss)

    def step_sum(self, steps: int, runtime: Any, filter_nonfinite: bool) -> float:
        """Sum of the recorded step losses, averaged over processes, then cleared."""
        window = torch.stack([t.reshape(()).float() for t in self.steps[:steps]])
        if filter_nonfinite:
            finite = torch.isfinite(window)
            count = finite.sum().clamp(min=1)
            total = torch.where(finite, window, 0.0).sum() / count * steps
        else:
            total = window.sum()
        total = runtime.all_reduce(total.reshape(1), "mean").item()
        del self.steps[:steps]
        return total

    def values(self, steps: int) -> list[float]:
        return [float(t) for t in self.steps[:steps]]

    def load(self, values: list[float]) -> None:
        self.steps = [torch.tensor(v, dtype=torch.float32, device=self.device) for v in values]

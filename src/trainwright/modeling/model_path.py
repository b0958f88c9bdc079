"""The model's forward for the Trainer's `compute_loss`, with the two model-path arguments:
`padding_free` (packed rows: the model is checked once to keep attention inside each sample) and
`fused_linear_cross_entropy` (the loss without the logits, `fused_loss.py`).

The Trainer calls :func:`forward` where it would call ``model(**inputs)``; with both arguments off it
is exactly that call.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import nn

from trainwright.args.checks import feature
from trainwright.modeling import fused_loss

logger = logging.getLogger(__name__)

# models checked on a packed row: model -> whether its forward takes `use_cache`
_PACKED_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
_SAMPLES_CHECKED = 4  # samples of the first packed row run alone and compared


class LossTrainer(Protocol):
    """What the model path reads of the Trainer."""

    args: Any
    label_smoother: Any
    compute_loss_func: Any


def is_packed(inputs: Mapping[str, Any]) -> bool:
    """A padding-free row: one row of `position_ids` that restart, and no attention mask."""
    positions = inputs.get("position_ids")
    return (
        "attention_mask" not in inputs
        and isinstance(positions, torch.Tensor)
        and positions.dim() == 2
        and positions.shape[0] == 1
    )


def _sample_bounds(positions: torch.Tensor) -> list[tuple[int, int]]:
    starts = (positions == 0).nonzero().flatten().tolist()
    ends = [*starts[1:], positions.numel()]
    return list(zip(starts, ends, strict=True))


def _last_hidden(model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    outputs = model(**inputs, output_hidden_states=True)
    hidden = getattr(outputs, "hidden_states", None)
    if hidden is not None:
        return hidden[-1].float()
    return outputs["logits"].float()


def check_packed_attention(model: nn.Module, inputs: Mapping[str, Any], takes_use_cache: bool) -> bool:
    """Whether the model keeps attention inside each sample of a packed row: the first samples'
    last hidden states in the row equal theirs run alone (eval mode, no gradients, RNG left as it
    was). False when the row holds one sample (nothing to tell yet); raises when they differ."""
    base = fused_loss.model_of(model)
    positions = inputs["position_ids"][0]
    bounds = _sample_bounds(positions)[:_SAMPLES_CHECKED]
    if len(bounds) < 2:
        return False
    end = bounds[-1][1]
    per_token = {
        k: v[:, :end]
        for k, v in inputs.items()
        if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == positions.numel() and k != "labels"
    }
    extra = {"use_cache": False} if takes_use_cache else {}
    device = positions.device
    tolerance = 2e-2 if torch.is_autocast_enabled(device.type) else 1e-4
    was_training = base.training
    try:
        base.eval()
        devices = [device.index or 0] if device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            packed = _last_hidden(base, {**per_token, **extra})[0]
            gaps = []
            for start, stop in bounds:
                alone = {k: v[:, start:stop] for k, v in per_token.items()}
                own = _last_hidden(base, {**alone, **extra})[0]
                gaps.append(float((packed[start:stop] - own).abs().max() / own.abs().max().clamp_min(1e-6)))
    finally:
        base.train(was_training)
    if max(gaps) > tolerance:
        raise ValueError(
            f"padding_free=True: {type(base).__name__} attends across the samples of a packed row (the "
            f"samples' hidden states in the row differ from theirs alone by up to {max(gaps):.1e} relative): "
            "its attention does not read the position_ids restarts. Set padding_free=False for this model."
        )
    logger.info("padding_free: %s keeps attention inside each packed sample (checked).", type(base).__name__)
    return True


def _packed_inputs(model: nn.Module, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
    """A packed row's inputs with the KV cache off (a cache turns transformers' packed-sequence
    masks off), after the model was checked once."""
    base = fused_loss.model_of(model)
    takes = _PACKED_CHECKED.get(base)
    if takes is None:
        params = inspect.signature(base.forward).parameters
        takes_use_cache = "use_cache" in params
        if check_packed_attention(model, inputs, takes_use_cache):
            _PACKED_CHECKED[base] = takes_use_cache
        takes = takes_use_cache
    return {**inputs, "use_cache": False} if takes else inputs


_REFUSALS_LOGGED: set[str] = set()


def _fused_refusal(trainer: LossTrainer) -> str | None:
    if trainer.compute_loss_func is not None:
        refusal = "compute_loss_func computes the loss from the outputs' logits"
    elif trainer.args.past_index >= 0:
        refusal = "past_index feeds model outputs back"
    else:
        return None
    if refusal not in _REFUSALS_LOGGED:
        _REFUSALS_LOGGED.add(refusal)
        logger.warning("fused_linear_cross_entropy: off, %s.", refusal)
    return refusal


def forward(
    trainer: LossTrainer,
    model: nn.Module,
    inputs: Mapping[str, Any],
    labels: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | None,
    return_outputs: bool,
) -> tuple[Any, torch.Tensor | None]:
    """The model's forward for `compute_loss`: (outputs, labels left for a loss to use).

    `inputs` are the ones `compute_loss` calls the model with (`labels` popped for label smoothing
    or `compute_loss_func`, `num_items_in_batch` in them when the model's loss takes it). With
    `fused_linear_cross_entropy`, where it applies, the outputs carry the fused loss, weighted as the
    model's (or `LabelSmoother`'s) would be, and no labels are left; otherwise (the argument off, the
    logits wanted, no labels, a model it does not apply to: logged once) it is ``model(**inputs)``
    with the labels as given.
    """
    args = trainer.args
    if not (feature(args, "padding_free") or feature(args, "fused_linear_cross_entropy")):
        return model(**inputs), labels  # a plain run: nothing else on its every step
    return _feature_forward(trainer, model, inputs, labels, num_items_in_batch, return_outputs)


def _feature_forward(
    trainer: LossTrainer,
    model: nn.Module,
    inputs: Mapping[str, Any],
    labels: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | None,
    return_outputs: bool,
) -> tuple[Any, torch.Tensor | None]:
    """`forward` with `padding_free` or `fused_linear_cross_entropy` on."""
    args = trainer.args
    if feature(args, "padding_free") and is_packed(inputs):
        inputs = _packed_inputs(model, inputs)
    if not feature(args, "fused_linear_cross_entropy") or fused_loss.logits_wanted(return_outputs):
        return model(**inputs), labels
    if _fused_refusal(trainer) is not None:
        return model(**inputs), labels
    targets, num_items = inputs.get("labels"), inputs.get("num_items_in_batch")
    if labels is not None:  # popped for the label smoother, which divides by num_items_in_batch when given
        targets, num_items = labels, num_items_in_batch
    if not isinstance(targets, torch.Tensor) or not fused_loss.decide(model, inputs, targets):
        return model(**inputs), labels
    smoother = trainer.label_smoother
    epsilon = float(smoother.epsilon) if smoother is not None else 0.0
    _, outputs = fused_loss.fused_causal_lm_loss(
        model, inputs, num_items, labels=targets, label_smoothing=epsilon
    )
    return outputs, None

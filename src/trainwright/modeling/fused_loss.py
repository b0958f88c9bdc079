"""`fused_linear_cross_entropy`: a language model's loss from its last hidden states and its output
embedding, without the ``batch x sequence x vocabulary`` logits (forward and backward).

How it stays model-agnostic: a forward pre-hook on the model's output embedding
(``get_output_embeddings()``, an ``nn.Linear``) keeps the head's input, whatever the model did to the
hidden states before it (final norm, scaling), and hands the head an empty slice of it, so the
forward the model runs (through DDP, torch.compile, autocast: the caller's wrapped model) computes
no logits. The loss is then :func:`~trainwright.modeling.linear_ce.linear_cross_entropy` of that
input, the head's weight and bias, and the targets the model's own loss would use (labels shifted by
one for a causal LM, as transformers' ``ForCausalLMLoss`` does, or its ``shift_labels``).

Whether it applies is decided once per model: refused by name for what changes logits after the head
(final-logit softcapping, a logit scale), for encoder-decoder models (their decoder inputs are made
from the labels), for heads that are not a plain ``nn.Linear`` or whose weight is sharded (FSDP2,
DeepSpeed ZeRO-3); then measured on the first real batch: the fused loss must equal the model's own
loss (eval mode, no gradients, every RNG left as it was). A model it does not apply to keeps its own
loss, with one log line saying why.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainwright.core.modules import unwrap_model
from trainwright.modeling.linear_ce import IGNORE_INDEX, linear_cross_entropy
from trainwright.modeling.loss import is_causal_lm

logger = logging.getLogger(__name__)

_HOOK_ATTRIBUTE = "_trainwright_head_input"
# decisions per model (weakly held): (applies, reason)
_DECISIONS: weakref.WeakKeyDictionary[nn.Module, tuple[bool, str]] = weakref.WeakKeyDictionary()
_LOSS_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("trainwright_loss_only", default=False)


class _HeadInput:
    """Forward pre-hook of the output embedding: while armed, it keeps the head's input and gives
    the head an empty slice of it (no logits are computed). Installed once per head and left in
    place (disarmed it returns nothing), so a compiled model is not re-traced at every call."""

    def __init__(self) -> None:
        self.armed = False
        self.calls = 0
        self.captured: torch.Tensor | None = None

    def __call__(self, module: nn.Module, args: tuple) -> tuple | None:
        if not self.armed:
            return None
        hidden = args[0]
        self.calls += 1
        self.captured = hidden
        return (hidden[..., :0, :], *args[1:])

    @contextlib.contextmanager
    def armed_for_one_forward(self) -> Iterator[_HeadInput]:
        self.armed, self.calls, self.captured = True, 0, None
        try:
            yield self
        finally:
            self.armed = False

    def take(self) -> torch.Tensor:
        hidden, self.captured = self.captured, None
        if hidden is None or self.calls != 1:
            raise RuntimeError(
                f"fused_linear_cross_entropy: the output embedding ran {self.calls} times in one forward "
                "(once expected); set fused_linear_cross_entropy=False for this model."
            )
        return hidden


def model_of(model: nn.Module) -> nn.Module:
    """The user's model under DDP, torch.compile, DataParallel and DeepSpeed's engine."""
    model = unwrap_model(model)
    while isinstance(getattr(model, "module", None), nn.Module) and not hasattr(
        model, "get_output_embeddings"
    ):
        model = unwrap_model(model.module)
    return model


def _head_of(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def _head_hook(head: nn.Module) -> _HeadInput:
    hook = getattr(head, _HOOK_ATTRIBUTE, None)
    if hook is None:
        hook = _HeadInput()
        head.register_forward_pre_hook(hook)
        setattr(head, _HOOK_ATTRIBUTE, hook)
    return hook


def _changes_logits_after_head(model: nn.Module) -> str | None:
    """What in the config or the model changes the logits after the head (None: nothing known)."""
    config = getattr(model, "config", None)
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is not None:
        return f"final_logit_softcapping={cap} (logits are capped after the head)"
    for owner in (model, config):
        for name in ("logit_scale", "logits_scaling", "output_multiplier_scale"):
            value = getattr(owner, name, None)
            if isinstance(value, (int, float)) and value != 1:
                return f"{name}={value} (logits are scaled after the head)"
    return None


def fused_loss_applies(model: nn.Module) -> tuple[bool, str]:
    """Whether the fused loss can stand in for `model`'s own, as far as the model's structure says
    (the measurement on a real batch, in :func:`decide`, comes after): (applies, reason)."""
    base = model_of(model)
    name = type(base).__name__
    config = getattr(base, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False, f"{name} is an encoder-decoder model: its decoder inputs are made from the labels"
    head = _head_of(base)
    if head is None:
        return False, f"{name} has no output embedding (get_output_embeddings() is None)"
    if type(head).forward is not nn.Linear.forward or not isinstance(head, nn.Linear):
        return False, f"{name}'s output embedding is a {type(head).__name__}, not a plain nn.Linear"
    weight = head.weight
    if type(weight).__name__ == "DTensor" or hasattr(weight, "ds_id"):
        return False, f"{name}'s output embedding weight is sharded (FSDP2 / tensor parallel / ZeRO-3)"
    changed = _changes_logits_after_head(base)
    if changed is not None:
        return False, f"{name} has {changed}"
    return True, f"{name}: logits = output_embedding(hidden states)"


def _targets(model: nn.Module, labels: torch.Tensor, shift_labels: torch.Tensor | None) -> torch.Tensor:
    """The per-position targets of the model's own loss: `shift_labels` as given, labels moved one
    to the left (-100 at the end) for a causal LM, else the labels."""
    if shift_labels is not None:
        return shift_labels
    if not is_causal_lm(model):
        return labels
    return nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)


def fused_causal_lm_loss(
    model: nn.Module,
    inputs: Mapping[str, Any],
    num_items_in_batch: torch.Tensor | int | None = None,
    *,
    labels: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Any]:
    """(loss, outputs) of `model` (the wrapped one: its forward runs) on `inputs` with the fused loss.

    ``labels`` default to ``inputs["labels"]``; ``inputs["shift_labels"]`` (transformers' name) are
    used as the targets when present; ``num_items_in_batch`` (or ``inputs["num_items_in_batch"]``)
    divides the summed loss, else the number of targets does. ``outputs`` are the model's, with
    ``loss`` set and empty logits. Check :func:`fused_loss_applies` first.
    """
    inputs = dict(inputs)
    given_labels = inputs.pop("labels", None)
    labels = labels if labels is not None else given_labels
    if labels is None:
        raise ValueError("fused_causal_lm_loss: the batch has no labels.")
    shift_labels = inputs.pop("shift_labels", None)
    in_batch = inputs.pop("num_items_in_batch", None)
    if num_items_in_batch is None:
        num_items_in_batch = in_batch
    base = model_of(model)
    head = _head_of(base)
    assert isinstance(head, nn.Linear)  # fused_loss_applies checked it
    hook = _head_hook(head)
    with hook.armed_for_one_forward():
        outputs = model(**inputs)
    hidden = hook.take()
    targets = _targets(base, labels, shift_labels)
    loss = linear_cross_entropy(
        hidden,
        head.weight,
        head.bias,
        targets,
        num_items_in_batch=num_items_in_batch,
        label_smoothing=label_smoothing,
    )
    if not isinstance(outputs, dict):  # ModelOutput is one: setting a key sets the attribute
        raise TypeError(
            f"fused_causal_lm_loss: {type(base).__name__} returned a {type(outputs).__name__}, not a "
            "ModelOutput (is return_dict off?)."
        )
    outputs["loss"] = loss
    return loss, outputs


def _relative_gap(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def measure(model: nn.Module, inputs: Mapping[str, Any], labels: torch.Tensor) -> tuple[bool | None, str]:
    """Compare the fused loss with the model's own on one real batch, in eval mode without gradients
    (every RNG and the model's mode left as they were): (equal within tolerance, what was seen), or
    (None, why) when the batch cannot tell (no targets)."""
    base = model_of(model)
    inputs = {k: v for k, v in inputs.items() if k not in ("labels", "num_items_in_batch")}
    device = labels.device
    devices = [device.index or 0] if device.type == "cuda" else []
    reduced = torch.is_autocast_enabled(device.type)
    tolerance = 2e-2 if reduced else 1e-4
    was_training = base.training
    try:
        base.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            own = getattr(base(**inputs, labels=labels), "loss", None)
            fused, _ = fused_causal_lm_loss(base, inputs, labels=labels)
    except (RuntimeError, TypeError, ValueError) as err:
        return False, f"the fused forward failed on the first batch ({type(err).__name__}: {err})"
    finally:
        base.train(was_training)
    if not isinstance(own, torch.Tensor) or own.numel() != 1:
        return False, f"{type(base).__name__} returned no scalar loss to compare with"
    own_value, fused_value = float(own.float()), float(fused.float())
    if not math.isfinite(own_value):
        return None, f"the model's loss on the first batch is {own_value} (no targets)"
    gap = _relative_gap(fused_value, own_value)
    seen = f"fused loss {fused_value:.6g} vs the model's {own_value:.6g} (relative gap {gap:.1e})"
    return gap <= tolerance, seen


def decide(model: nn.Module, inputs: Mapping[str, Any], labels: torch.Tensor) -> bool:
    """Whether `model` takes the fused loss: its structure, then one measurement on a real batch;
    decided once per model and logged once (a fallback with its reason)."""
    base = model_of(model)
    known = _DECISIONS.get(base)
    if known is not None:
        return known[0]
    applies, reason = fused_loss_applies(base)
    if applies:
        measured, reason = measure(model, inputs, labels)
        if measured is None:  # this batch cannot tell; the next one will be measured
            return False
        applies = measured
        reason = f"{type(base).__name__}: {reason}"
    _DECISIONS[base] = (applies, reason)
    if applies:
        logger.info("fused_linear_cross_entropy: on (%s).", reason)
    else:
        logger.warning("fused_linear_cross_entropy: off, the model computes its own loss: %s.", reason)
    return applies


@contextlib.contextmanager
def loss_only(enabled: bool) -> Iterator[None]:
    """Within the block, `compute_loss(..., return_outputs=True)` may skip the logits (an evaluation
    with `prediction_loss_only`)."""
    token = _LOSS_ONLY.set(enabled)
    try:
        yield
    finally:
        _LOSS_ONLY.reset(token)


def logits_wanted(return_outputs: bool) -> bool:
    """Whether a `compute_loss` call needs the logits (its outputs are returned outside a `loss_only`
    block)."""
    return return_outputs and not _LOSS_ONLY.get()

"""`use_liger_kernel` / `liger_kernel_config`: patch a transformers model with Liger's Triton kernels.

Liger (`pip install liger-kernel`) replaces a supported model type's RMSNorm, RoPE, SwiGLU and
cross-entropy (fused with the LM head) by Triton GPU kernels, in place on the model instance. What
transformers would skip with a log line is refused here: a missing package, a model that is not a
`PreTrainedModel`, a model type Liger has no kernels for, a config key the model type's patch does
not take, and a CPU run (Triton kernels need a GPU). Note that Liger also replaces the model type's
classes in transformers' modeling module, so models of that type built later in the process use
its kernels too (as with transformers).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

_APPLIED = "_trainwright_liger_applied"


def _load() -> tuple[Any, dict[str, Any]]:
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as e:
        raise ImportError(
            "use_liger_kernel=True needs the liger-kernel package (and Triton), which could not be imported "
            f"({e}). Install it with `pip install liger-kernel`, or set use_liger_kernel=False."
        ) from e
    return _apply_liger_kernel_to_instance, MODEL_TYPE_TO_APPLY_LIGER_FN


def is_applied(model: nn.Module) -> bool:
    return bool(getattr(model, _APPLIED, False))


def apply(model: nn.Module, config: dict[str, Any] | None, device: torch.device) -> None:
    """Patch `model` in place with the kernels `config` selects (Liger's defaults when None)."""
    apply_to_instance, patches = _load()
    if device.type == "cpu":
        raise ValueError(
            "use_liger_kernel=True: Liger's kernels are Triton GPU kernels and this run trains on the CPU. "
            "Train on a GPU, or set use_liger_kernel=False."
        )
    get_base_model = getattr(model, "get_base_model", None)
    base = get_base_model() if callable(get_base_model) else model
    try:
        from transformers import PreTrainedModel
    except ImportError:
        is_pretrained = False
    else:
        is_pretrained = isinstance(base, PreTrainedModel)
    if not is_pretrained:
        raise ValueError(
            f"use_liger_kernel=True: {type(base).__name__} is not a transformers PreTrainedModel; Liger patches "
            "transformers models by their config's model_type. Set use_liger_kernel=False."
        )
    model_type = getattr(base.config, "model_type", None)
    if model_type not in patches:
        raise ValueError(
            f"use_liger_kernel=True: liger-kernel has no kernels for model_type={model_type!r}. "
            f"Supported: {sorted(patches)}."
        )
    config = dict(config or {})
    accepted = set(inspect.signature(patches[model_type]).parameters) - {"model"}
    unknown = sorted(set(config) - accepted)
    if unknown:
        raise ValueError(
            f"liger_kernel_config: {unknown} are not options of Liger's patch for {model_type!r}; "
            f"it takes {sorted(accepted)}."
        )
    if is_applied(base):
        return  # patched by an earlier train() of this Trainer
    apply_to_instance(model=base, **config)
    setattr(base, _APPLIED, True)
    if base is not model:
        setattr(model, _APPLIED, True)

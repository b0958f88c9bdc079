"""NEFTune (`neftune_noise_alpha`): uniform noise on the input embeddings while training.

Noise in [-a, a] with a = alpha / sqrt(L * d) (L: sequence length, d: embedding width) is added to the
output of `model.get_input_embeddings()` by a forward hook that acts only when the embedding module is
in training mode, so evaluation and prediction see clean embeddings (Jain et al., 2023; as
transformers). The Trainer attaches the hook at the start of `train()` and removes it at the end.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def input_embeddings(model: nn.Module) -> nn.Module:
    """The module whose output NEFTune perturbs (a PEFT wrapper is looked through)."""
    base = model
    if hasattr(model, "get_base_model") and callable(model.get_base_model):  # peft.PeftModel
        base = model.get_base_model()
    getter = getattr(base, "get_input_embeddings", None)
    embeddings = getter() if callable(getter) else None
    if not isinstance(embeddings, nn.Module):
        raise ValueError(
            f"neftune_noise_alpha is set, but {type(base).__name__} has no input embeddings to add noise to: "
            "NEFTune needs a model whose `get_input_embeddings()` returns its embedding module (as a "
            "transformers PreTrainedModel does). Define it, or leave neftune_noise_alpha=None."
        )
    return embeddings


def activate(model: nn.Module, alpha: float) -> RemovableHandle:
    """Hook NEFTune noise onto the model's input embeddings; returns the handle that removes it."""
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
        raise ValueError(f"neftune_noise_alpha={alpha!r} is invalid: expected a number > 0 (or None).")
    scale = float(alpha)

    def add_noise(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        if not module.training:
            return output
        if not isinstance(output, torch.Tensor) or output.dim() < 2:
            raise ValueError(
                "neftune_noise_alpha: the input embeddings returned "
                f"{type(output).__name__} {getattr(output, 'shape', '')}, not a (..., length, width) tensor."
            )
        bound = scale / math.sqrt(output.shape[-2] * output.shape[-1])
        return output + torch.empty_like(output).uniform_(-bound, bound)

    return input_embeddings(model).register_forward_hook(add_noise)

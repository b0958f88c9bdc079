"""The user's module behind the wrappers training puts around it."""

from __future__ import annotations

import sys
from typing import Any

import torch


def unwrap_model(model: Any) -> Any:
    """The module inside DistributedDataParallel / DataParallel (`.module`) and torch.compile
    (`._orig_mod`) wrappers, nested in any order: the one whose `state_dict` keys, `forward` signature
    and `config` are the model's own. Anything else (None included) is returned as it is."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(inner := getattr(model, "_orig_mod", None), torch.nn.Module):
            model = inner
        else:
            return model


def is_peft_model(model: Any) -> bool:
    """Whether `model` (inside DDP / compile wrappers) is a `peft.PeftModel` or `PeftMixedModel`
    (told without importing peft: an instance implies it is imported)."""
    peft = sys.modules.get("peft")
    if peft is None:
        return False
    classes = tuple(c for c in (getattr(peft, "PeftModel", None), getattr(peft, "PeftMixedModel", None)) if c)
    return isinstance(unwrap_model(model), classes)


def without_peft(model: Any) -> Any:
    """The transformers model a PEFT model wraps (its forward's signature says what a batch holds and
    which keys are labels, as upstream inspects it); any other model unwrapped as `unwrap_model`."""
    model = unwrap_model(model)
    if not is_peft_model(model):
        return model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model.base_model.model
    return base

"""The user's module behind the wrappers training puts around it."""

from __future__ import annotations

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

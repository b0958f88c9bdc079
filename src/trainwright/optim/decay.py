"""Which parameters get weight decay (all but biases and normalisation weights, as upstream) and
the optimizer's param groups that follow from it."""

from __future__ import annotations

import re
from typing import Any

from torch import nn

# Normalisation layers of torch (_NormBase covers BatchNorm*, SyncBatchNorm and InstanceNorm*).
_NORM_TYPES: tuple[type[nn.Module], ...] = tuple(
    t
    for t in (nn.LayerNorm, getattr(nn, "RMSNorm", None), nn.GroupNorm, nn.modules.batchnorm._NormBase)
    if t is not None
)
# A name component that marks a bias or a normalisation weight: "bias", "c_attn.bias",
# "input_layernorm", "q_norm", "norm1", "norm_out", and GPT-2 style "ln_1", "ln_f".
_NO_DECAY_COMPONENT = re.compile(r".*bias.*|.*(layernorm|rmsnorm).*|(.*_)?norm(\d+|_\w+)?|ln(\d+|_\w+)?")


def _is_norm_module(module: nn.Module) -> bool:
    # Model libraries define their own norms (LlamaRMSNorm, T5LayerNorm) without subclassing torch's.
    return isinstance(module, _NORM_TYPES) or type(module).__name__.lower().endswith("norm")


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that get weight decay: all but biases and normalisation weights.

    A parameter is left out when it belongs directly to a normalisation module, or when any dotted
    component of its name looks like a bias or a norm (see `_NO_DECAY_COMPONENT`). Embeddings get
    decay. Tied parameters are listed under every name they have (e.g. both `transformer.wte.weight`
    and `lm_head.weight`), so a membership test works with whichever name `named_parameters` gives.
    """
    names: list[str] = []
    seen: set[str] = set()
    for module_name, module in model.named_modules(remove_duplicate=False):
        if _is_norm_module(module):
            continue
        for param_name, _ in module.named_parameters(prefix=module_name, recurse=False):
            if param_name in seen:
                continue
            seen.add(param_name)
            if not any(_NO_DECAY_COMPONENT.fullmatch(part) for part in param_name.lower().split(".")):
                names.append(param_name)
    return names


def decay_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Param groups for an optimizer: `weight_decay` for decayed params, 0.0 for biases and norms.

    Only parameters with `requires_grad` are included. Both groups are kept, an empty one too (a LoRA
    adapter has no bias or norm), as transformers builds them: optimizer files then load across the
    two libraries.
    """
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ValueError(
            f"create_optimizer: {type(model).__name__} has no parameters with requires_grad=True"
        )
    decay = set(get_decay_parameter_names(model))
    groups = [
        {"params": [p for n, p in trainable if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in trainable if n not in decay], "weight_decay": 0.0},
    ]
    return groups

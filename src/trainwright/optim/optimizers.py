"""Optimizer creation with the names and parameter grouping of `transformers.Trainer`.

`args` is anything with the `TrainingArguments` fields used here: `optim`, `learning_rate`,
`weight_decay`, `adam_beta1`, `adam_beta2`, `adam_epsilon`, `optim_args` (and the legacy
`adafactor` flag).

About `adamw_torch_fused`: fused AdamW is chosen only where this torch build has the fused kernel
for the device of every parameter (CUDA; CPU, MPS and XPU in recent torch); elsewhere it falls
back to the multi-tensor (`foreach`) kernel where that exists, else to torch's default. On CPU the
fused kernel is NOT bit-identical to the for-loop AdamW (it differs in the last bits: about 1e-7
after 20 fp32 steps in our test), while `foreach` matches the for-loop exactly. Resume stays exact either way, because the same kernel
runs before and after a resume; only comparisons across `optim` values need a tolerance.

The other names of transformers' `OptimizerNames` (bitsandbytes, torchao, schedule-free, GaLore,
APOLLO, LOMO, ...) are built by `trainwright.optim.extra` from their optional packages.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Any

import torch
from torch import nn

from trainwright.optim.adafactor import adafactor_class
from trainwright.optim.decay import decay_param_groups
from trainwright.optim.decay import get_decay_parameter_names as get_decay_parameter_names  # re-exported
from trainwright.optim.extra import EXTRA_OPTIMIZER_NAMES, get_extra_cls_and_kwargs, make_checkpointable

TORCH_OPTIMIZER_NAMES: tuple[str, ...] = (
    "adamw_torch",
    "adamw_hf",
    "adamw_torch_fused",
    "adamw_torch_foreach",
    "adafactor",
    "sgd",
    "adagrad",
    "rmsprop",
)
OPTIMIZER_NAMES: tuple[str, ...] = TORCH_OPTIMIZER_NAMES + EXTRA_OPTIMIZER_NAMES
_ADAMW_NAMES = ("adamw_torch", "adamw_hf", "adamw_torch_fused", "adamw_torch_foreach")


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    if len(text) >= 2 and text[0] + text[-1] in ("()", "[]"):
        return tuple(_parse_value(part) for part in _split_top_level(text[1:-1]) if part)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets, so "betas=(0.9,0.95),eps=1e-6" has two items."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def parse_optim_args(optim_args: str | dict[str, Any] | None) -> dict[str, Any]:
    """Parse `optim_args` ("k=v,k=v") into typed values: bool, None, int, float, tuple, else string.

    Example: "momentum=0.9,nesterov=true,betas=(0.9,0.95)" gives
    {"momentum": 0.9, "nesterov": True, "betas": (0.9, 0.95)}. A dict is taken as is, its string
    values parsed the same way.
    """
    if not optim_args:
        return {}
    if isinstance(optim_args, dict):
        return {k: _parse_value(v) if isinstance(v, str) else v for k, v in optim_args.items()}
    parsed: dict[str, Any] = {}
    for item in _split_top_level(optim_args):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(
                f"optim_args: expected comma-separated key=value pairs; got {item!r} in {optim_args!r}"
            )
        if key in parsed:
            raise ValueError(f"optim_args: {key!r} is given twice in {optim_args!r}")
        parsed[key] = _parse_value(value)
    return parsed


def _optimizer_name(args: Any) -> str:
    if getattr(args, "adafactor", False):
        return "adafactor"
    name = args.optim.value if isinstance(args.optim, Enum) else args.optim
    name = str(name).strip().lower()
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"optim: unknown optimizer {args.optim!r}; choose one of {list(OPTIMIZER_NAMES)}")
    return name


def _fused_devices() -> set[str]:
    try:  # the set torch itself checks `fused=True` against
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return set(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover - moved in some future torch
        return {"cuda"}


def _foreach_devices() -> set[str]:
    try:
        from torch.optim.optimizer import _get_foreach_kernels_supported_devices

        return set(_get_foreach_kernels_supported_devices())
    except ImportError:  # pragma: no cover
        return {"cuda"}


def _fast_adamw_kwargs(model: nn.Module | None) -> dict[str, bool]:
    """{"fused": True} where every parameter can use the fused kernel, else foreach, else {}."""
    if model is None:
        # Without parameters to look at, request fused when it exists for every device the
        # runtime can pick (cpu, cuda, mps).
        return {"fused": True} if {"cpu", "cuda", "mps"} <= _fused_devices() else {}
    params = [p for p in model.parameters() if p.requires_grad]
    devices = {p.device.type for p in params}
    if devices and devices <= _fused_devices() and all(p.is_floating_point() for p in params):
        return {"fused": True}
    if devices and devices <= _foreach_devices():
        return {"foreach": True}
    return {}


def get_optimizer_cls_and_kwargs(
    args: Any, model: nn.Module | None = None
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The optimizer class for `args.optim` and its constructor kwargs (all but the params).

    kwargs: `lr=args.learning_rate`; AdamW adds `betas=(adam_beta1, adam_beta2)` and
    `eps=adam_epsilon`; `adamw_torch_fused` adds `fused=True` or a fallback (module docstring);
    `adamw_torch_foreach` adds `foreach=True`; Adafactor is transformers' (`optim.adafactor`) with
    `scale_parameter=False, relative_step=False`.
    Entries of `args.optim_args` are added last and override these; a key the optimizer does not
    take is an error. `model` is used to see which device the parameters are on. Names from
    optional packages: `trainwright.optim.extra` (kwargs may then hold `params`, `model` or
    `optimizer_dict`, which `build_optimizer` uses in place of the decay groups, as upstream).
    """
    name = _optimizer_name(args)
    if name in EXTRA_OPTIMIZER_NAMES:
        return get_extra_cls_and_kwargs(
            name, args, model, parse_optim_args(getattr(args, "optim_args", None))
        )
    kwargs: dict[str, Any] = {"lr": args.learning_rate}
    if name in _ADAMW_NAMES:
        cls: type[torch.optim.Optimizer] = torch.optim.AdamW
        kwargs["betas"] = (args.adam_beta1, args.adam_beta2)
        kwargs["eps"] = args.adam_epsilon
    elif name == "adafactor":  # upstream's: a manual lr, no parameter scaling
        cls = adafactor_class()
        kwargs.update(scale_parameter=False, relative_step=False)
    else:
        cls = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "rmsprop": torch.optim.RMSprop}[name]

    extra = parse_optim_args(getattr(args, "optim_args", None))
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "params")]
    unknown = sorted(set(extra) - set(accepted))
    if unknown:
        raise ValueError(
            f"optim_args {unknown} not accepted by {cls.__name__} (optim={name!r}); accepted: {accepted}"
        )
    # An explicit kernel choice in optim_args replaces the automatic one.
    if not {"fused", "foreach"} & set(extra):
        if name == "adamw_torch_fused":
            kwargs.update(_fast_adamw_kwargs(model))
        elif name == "adamw_torch_foreach":
            kwargs["foreach"] = True
    kwargs.update(extra)
    return cls, kwargs


def build_optimizer(
    cls: Any, kwargs: dict[str, Any], model: nn.Module, weight_decay: float
) -> torch.optim.Optimizer:
    """`cls(decay_param_groups(model, weight_decay), **kwargs)`, with upstream's special kwargs.

    `params` (GaLore/APOLLO groups), `model` (LOMO) or `optimizer_dict` (layer-wise) in kwargs take
    the place of the decay groups. bitsandbytes 8-bit optimizers keep embeddings in 32 bits, as
    upstream; torchao/GaLore/APOLLO state is made checkpointable (`optim_extra.make_checkpointable`).
    """
    kwargs = dict(kwargs)
    first: Any = None
    for key in ("params", "model", "optimizer_dict"):  # upstream's order: the last one present wins
        if key in kwargs:
            first = kwargs.pop(key)
    if first is None:
        first = decay_param_groups(model, weight_decay)
    optimizer = make_checkpointable(cls(first, **kwargs))
    if cls.__module__.startswith("bitsandbytes") and kwargs.get("optim_bits") == 8:
        import bitsandbytes

        manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    return optimizer


def create_optimizer(
    model: nn.Module, args: Any, cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None
) -> torch.optim.Optimizer:
    """Build the `args.optim` optimizer over `decay_param_groups(model, args.weight_decay)`.

    `cls_and_kwargs` replaces `get_optimizer_cls_and_kwargs(args, model)` (a Trainer passes its
    own, possibly overridden, method's answer).
    """
    cls, kwargs = cls_and_kwargs if cls_and_kwargs is not None else get_optimizer_cls_and_kwargs(args, model)
    if "weight_decay" in kwargs and kwargs["weight_decay"] != args.weight_decay:
        raise ValueError(
            f"optim_args sets weight_decay={kwargs['weight_decay']} but weight decay comes from "
            f"weight_decay ({args.weight_decay}); set that instead"
        )
    return build_optimizer(cls, kwargs, model, args.weight_decay)

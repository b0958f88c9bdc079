"""Optimizers from optional packages or devices, with the names and kwargs of transformers 5.23.

`get_extra_cls_and_kwargs` is called by `trainwright.optim.get_optimizer_cls_and_kwargs` for every
`optim` outside torch's own. Each family takes its keys from `optim_args` with upstream's defaults;
the keys left over go to the constructor when it accepts them and are an error otherwise (upstream
drops them silently). A missing package is an `ImportError` naming the package and its pip command;
a missing device is a `ValueError` naming it.

Where trainwright departs from upstream, it is to honour a `TrainingArguments` field upstream drops:
GaLore/APOLLO/layer-wise param groups keep `weight_decay` (0 for biases and norms); LOMO gets
`weight_decay` and `max_grad_norm` (as `clip_grad_norm`, which costs LOMO a second backward pass).
Settings an optimizer cannot honour (clipping or accumulation for optimizers that step inside the
backward, fp16 loss scaling) are refused with the field to change.
"""

from __future__ import annotations

import importlib
import inspect
import re
from types import ModuleType
from typing import Any, cast

import torch
from torch import nn

from trainwright.optim.decay import get_decay_parameter_names

_BNB = (
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_32bit",
    "paged_adamw_8bit",
    "ademamix",
    "ademamix_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "lion_8bit",
    "lion_32bit",
    "paged_lion_32bit",
    "paged_lion_8bit",
    "rmsprop_bnb",
    "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit",
)
_GALORE = (
    "galore_adamw",
    "galore_adamw_8bit",
    "galore_adafactor",
    "galore_adamw_layerwise",
    "galore_adamw_8bit_layerwise",
    "galore_adafactor_layerwise",
)
_APOLLO = ("apollo_adamw", "apollo_adamw_layerwise")
_SCHEDULE_FREE = ("schedule_free_adamw", "schedule_free_sgd", "schedule_free_radam")
_OTHERS = (
    "adamw_torch_xla",
    "adamw_torch_npu_fused",
    "adamw_apex_fused",
    "adamw_anyprecision",
    "adamw_torch_4bit",
    "adamw_torch_8bit",
    "lomo",
    "adalomo",
    "grokadamw",
    "stable_adamw",
)
EXTRA_OPTIMIZER_NAMES: tuple[str, ...] = _OTHERS + _BNB + _GALORE + _APOLLO + _SCHEDULE_FREE


class MissingOptimizerPackageError(ImportError, ValueError):
    """An `optim` whose optional package is missing: the documented `ImportError`, and also the
    `ValueError` transformers raises for some of them (torch_xla, torch_npu, torchdistx, grokadamw),
    so code catching either catches it."""


def _require(
    module: str,
    name: str,
    package: str,
    install: str | None = None,
    minimum: str | None = None,
    device: str | None = None,
) -> ModuleType:
    """Import `module` for optim=`name`, or say which package (and device) it needs and how to install it."""
    try:
        mod = importlib.import_module(module)
    except ImportError as error:
        on = f" on {device}" if device else ""
        raise MissingOptimizerPackageError(
            f"optim={name!r} needs the {package!r} package{on}: {install or 'pip install ' + package}"
        ) from error
    if minimum is not None:
        from importlib.metadata import version

        from packaging.version import Version

        if Version(version(package)) < Version(minimum):
            raise MissingOptimizerPackageError(
                f"optim={name!r} needs {package}>={minimum}: pip install -U '{package}>={minimum}'"
            )
    return mod


def _param_devices(model: nn.Module | None) -> set[str]:
    return {p.device.type for p in model.parameters()} if model is not None else set()


def _refuse_in_backward_stepping(name: str, args: Any, layerwise: bool) -> None:
    """Optimizers that update each weight inside the backward cannot accumulate, clip or unscale."""
    if getattr(args, "gradient_accumulation_steps", 1) != 1:
        raise ValueError(
            f"optim={name!r} updates the weights during the backward pass, so it cannot accumulate "
            "gradients: set gradient_accumulation_steps=1"
        )
    if getattr(args, "fp16", False):
        raise ValueError(f"optim={name!r} cannot be combined with fp16 loss scaling: use bf16=True or fp32")
    if layerwise and (getattr(args, "max_grad_norm", 0) or 0) > 0:
        raise ValueError(
            f"optim={name!r} steps each parameter as soon as its gradient is ready, so gradients "
            "cannot be clipped: set max_grad_norm=0"
        )
    if layerwise and getattr(args, "world_size", 1) > 1:
        raise ValueError(f"optim={name!r} does not support distributed training (as upstream)")


def _adam_kwargs(args: Any) -> dict[str, Any]:
    return {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}


# ----------------------------------------------------------------------------------- families


def _device_adamw(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    """AdamW variants that only run on one kind of device."""
    if name == "adamw_torch_xla":
        device, what = "xla", "an XLA device (TPU)"
        mod = _require(
            "torch_xla.amp.syncfree", name, "torch-xla", "pip install 'torch-xla[tpu]'", device=what
        )
        cls = mod.AdamW
    elif name == "adamw_torch_npu_fused":
        device, what = "npu", "an Ascend NPU"
        mod = _require("torch_npu.optim", name, "torch-npu", device=what)
        cls = mod.NpuFusedAdamW
    else:  # adamw_apex_fused (v4 name)
        device, what = "cuda", "CUDA"
        install = (  # the "apex" on PyPI is another project
            "pip install -v --no-build-isolation --config-settings '--build-option=--cpp_ext' "
            "--config-settings '--build-option=--cuda_ext' git+https://github.com/NVIDIA/apex"
        )
        mod = _require("apex.optimizers", name, "NVIDIA apex", install, device=what)
        cls = mod.FusedAdam
    devices = _param_devices(model)
    if devices and devices != {device}:
        raise ValueError(f"optim={name!r} needs the parameters on {what}; they are on {sorted(devices)}")
    return cls, {**_adam_kwargs(args), **extra}


def _anyprecision(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    mod = _require(
        "torchdistx.optimizers",
        name,
        "torchdistx",
        "pip install git+https://github.com/pytorch/torchdistx (not on PyPI)",
    )
    dtype = lambda key, default: getattr(torch, str(extra.pop(key, default)))  # noqa: E731
    kwargs = {
        **_adam_kwargs(args),
        "use_kahan_summation": bool(extra.pop("use_kahan_summation", False)),
        "momentum_dtype": dtype("momentum_dtype", "float32"),
        "variance_dtype": dtype("variance_dtype", "float32"),
        "compensation_buffer_dtype": dtype("compensation_buffer_dtype", "bfloat16"),
    }
    return mod.AnyPrecisionAdamW, {**kwargs, **extra}


def _bitsandbytes(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    bnb = _require("bitsandbytes.optim", name, "bitsandbytes")
    kwargs: dict[str, Any] = {"optim_bits": 8 if "8bit" in name else 32}
    if "rmsprop" in name:
        cls = bnb.RMSprop  # upstream passes optim_args straight through
    else:
        kwargs["is_paged"] = "paged" in name
        if "adam" in name and "ademamix" not in name:
            cls = bnb.AdamW
            kwargs.update(_adam_kwargs(args))
        elif "lion" in name:
            cls = bnb.Lion
            kwargs["betas"] = (args.adam_beta1, args.adam_beta2)
        else:
            cls = bnb.AdEMAMix
            kwargs["betas"] = (
                float(extra.pop("beta1", args.adam_beta1)),
                float(extra.pop("beta2", args.adam_beta2)),
                float(extra.pop("beta3", 0.9999)),
            )
            kwargs["alpha"] = float(extra.pop("alpha", 5.0))
            kwargs["eps"] = float(extra.pop("eps", args.adam_epsilon))
            for key in ("t_alpha", "t_beta3"):
                if key in extra:
                    kwargs[key] = int(extra.pop(key))
    return cls, {**kwargs, **extra}


def _torchao(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    ao = _require("torchao.optim", name, "torchao", minimum="0.11.0")
    cls = ao.AdamW4bit if name == "adamw_torch_4bit" else ao.AdamW8bit
    kwargs = {
        "block_size": int(extra.pop("block_size", 256)),
        "bf16_stochastic_round": bool(extra.pop("bf16_stochastic_round", False)),
        **_adam_kwargs(args),
    }
    return cls, {**kwargs, **extra}


def _schedule_free(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    sf = _require("schedulefree", name, "schedulefree", minimum="1.4.0")
    kwargs: dict[str, Any] = {}
    if name == "schedule_free_radam":
        cls = sf.RAdamScheduleFree  # it warms up by itself: no warmup_steps
        kwargs.update(_adam_kwargs(args))
    elif name == "schedule_free_adamw":
        cls = sf.AdamWScheduleFree
        kwargs.update(_adam_kwargs(args))
        kwargs["warmup_steps"] = args.warmup_steps
    else:
        cls = sf.SGDScheduleFree
        kwargs["warmup_steps"] = args.warmup_steps
    kwargs["weight_decay"] = args.weight_decay
    kwargs["weight_lr_power"] = float(extra.pop("weight_lr_power", 2.0))
    kwargs["r"] = float(extra.pop("r", 0.0))
    return cls, {**kwargs, **extra}


def _stable_adamw(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    optimi = _require("optimi", name, "torch-optimi")
    max_lr, kahan_sum = extra.pop("max_lr", None), extra.pop("kahan_sum", None)
    kwargs = {
        **_adam_kwargs(args),
        "weight_decay": args.weight_decay,
        "decouple_lr": bool(extra.pop("decouple_lr", False)),
        "max_lr": None if max_lr is None else float(max_lr),
        "kahan_sum": None if kahan_sum is None else bool(kahan_sum),
    }
    return optimi.StableAdamW, {**kwargs, **extra}


def _grokadamw(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    grok = _require("grokadamw", name, "grokadamw")
    defaults = {
        "alpha_init": 0.98,
        "lamb": 2.0,
        "gamma": 0.1,
        "grokking_signal_decay_rate": 0.1,
        "gradient_clipping": 1.0,
    }
    # upstream passes no betas/eps: GrokAdamW keeps its own defaults
    return grok.GrokAdamW, {**{k: float(extra.pop(k, v)) for k, v in defaults.items()}, **extra}


def _lomo(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    lomo = _require("lomo_optim", name, "lomo-optim")
    if model is None:
        raise ValueError(f"optim={name!r} needs the model: pass model= to get_optimizer_cls_and_kwargs")
    if name == "adalomo" and _param_devices(model) != {"cuda"}:
        raise ValueError(
            f"optim={name!r} needs the parameters on CUDA (AdaLomo allocates its state with .cuda())"
        )
    _refuse_in_backward_stepping(name, args, layerwise=False)
    kwargs: dict[str, Any] = {"model": model, "weight_decay": args.weight_decay}
    max_grad_norm = getattr(args, "max_grad_norm", None)
    if max_grad_norm and max_grad_norm > 0:
        kwargs["clip_grad_norm"] = max_grad_norm  # LOMO's own clipping (a second backward pass)
    return (lomo.AdaLomo if name == "adalomo" else lomo.Lomo), {**kwargs, **extra}


def _target_parameter_names(name: str, args: Any, model: nn.Module | None) -> set[str]:
    """Weights of the `nn.Linear` modules that `optim_target_modules` names (GaLore/APOLLO)."""
    targets = getattr(args, "optim_target_modules", None)
    if targets is None:
        raise ValueError(
            f"optim={name!r} needs optim_target_modules (module names, a regex, or 'all-linear')"
        )
    if not isinstance(targets, (list, str)):
        raise TypeError(
            f"optim_target_modules must be a list of names, a regex or 'all-linear'; got {targets!r}"
        )
    if model is None:
        raise ValueError(f"optim={name!r} needs the model: pass model= to get_optimizer_cls_and_kwargs")
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    found: set[str] = set()
    for module_name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if isinstance(targets, str):  # a regex over the whole module name, as upstream
            hit = all_linear or re.fullmatch(targets, module_name) is not None
        else:  # each entry: the exact name, a part of it, or a regex over it, as upstream
            hit = any(t in module_name or re.fullmatch(t, module_name) for t in targets)
        if hit:
            found.add(f"{module_name}.weight" if module_name else "weight")
    if not found:
        raise ValueError(f"optim={name!r}: no nn.Linear matches optim_target_modules={targets!r}")
    return found


def _low_rank(name: str, args: Any, model: nn.Module | None, extra: dict) -> tuple[type, dict]:
    """GaLore and APOLLO: low-rank projection of the targeted Linear weights, optionally layer-wise."""
    layerwise = name.endswith("_layerwise")
    if name.startswith("galore"):
        galore = _require("galore_torch", name, "galore-torch")
        base = name.removesuffix("_layerwise")
        cls = {
            "galore_adamw": galore.GaLoreAdamW,
            "galore_adamw_8bit": galore.GaLoreAdamW8bit,
            "galore_adafactor": galore.GaLoreAdafactor,
        }[base]
        if base == "galore_adamw_8bit" and model is not None and _param_devices(model) != {"cuda"}:
            raise ValueError(
                f"optim={name!r} needs the parameters on CUDA (GaLoreAdamW8bit synchronises CUDA)"
            )
        projection = {
            "rank": int(extra.pop("rank", 128)),
            "update_proj_gap": int(extra.pop("update_proj_gap", 200)),
            "scale": float(extra.pop("scale", 0.25)),
            "proj_type": extra.pop("proj_type", "std"),
        }
        kwargs: dict[str, Any] = {"lr": args.learning_rate}
        if base == "galore_adafactor":
            kwargs.update(scale_parameter=False, relative_step=False)
    else:
        apollo = _require("apollo_torch", name, "apollo-torch")
        cls = apollo.APOLLOAdamW
        projection = {
            "rank": int(extra.pop("rank", 128)),
            "proj": extra.pop("proj", "random"),
            "scale_type": extra.pop("scale_type", "channel"),
            "update_proj_gap": int(extra.pop("update_proj_gap", 200)),
            "scale": float(extra.pop("scale", 1.0)),
            "proj_type": extra.pop("proj_type", "std"),
            **_adam_kwargs(args),
        }
        kwargs = {"lr": args.learning_rate}
    if layerwise:
        _refuse_in_backward_stepping(name, args, layerwise=True)
    targets = _target_parameter_names(name, args, model)
    assert model is not None  # _target_parameter_names refuses None
    decay = set(get_decay_parameter_names(model))
    kwargs.update(extra)
    groups = []  # targets in their own group with the projection settings; weight_decay kept
    for is_target in (False, True):
        for decayed in (True, False):
            params = [
                p
                for n, p in model.named_parameters()
                if p.requires_grad and (n in targets) == is_target and (n in decay) == decayed
            ]
            if params:
                wd = args.weight_decay if decayed else 0.0
                groups.append({"params": params, "weight_decay": wd, **(projection if is_target else {})})
    if not layerwise:
        return cls, {**kwargs, "params": groups}
    optimizer_dict = {
        p: cls([{**{k: v for k, v in g.items() if k != "params"}, "params": [p]}], **kwargs)
        for g in groups
        for p in g["params"]
    }
    return LayerWiseOptimizer, {"lr": args.learning_rate, "optimizer_dict": optimizer_dict}


_FAMILIES = {
    **dict.fromkeys(("adamw_torch_xla", "adamw_torch_npu_fused", "adamw_apex_fused"), _device_adamw),
    "adamw_anyprecision": _anyprecision,
    **dict.fromkeys(_BNB, _bitsandbytes),
    **dict.fromkeys(("adamw_torch_4bit", "adamw_torch_8bit"), _torchao),
    **dict.fromkeys(_SCHEDULE_FREE, _schedule_free),
    "stable_adamw": _stable_adamw,
    "grokadamw": _grokadamw,
    **dict.fromkeys(("lomo", "adalomo"), _lomo),
    **dict.fromkeys(_GALORE + _APOLLO, _low_rank),
}


def get_extra_cls_and_kwargs(
    name: str, args: Any, model: nn.Module | None, optim_args: dict[str, Any]
) -> tuple[type, dict[str, Any]]:
    """(class, kwargs) for an `EXTRA_OPTIMIZER_NAMES` optimizer; `optim_args` are parsed values.

    kwargs may hold `params` (GaLore/APOLLO groups), `model` (LOMO) or `optimizer_dict`
    (layer-wise), which replace the Trainer's param groups as upstream.
    """
    extra = dict(optim_args)
    cls: type[Any]
    cls, kwargs = _FAMILIES[name](name, args, model, extra)
    kwargs.setdefault("lr", args.learning_rate)
    kwargs = {"lr": kwargs.pop("lr"), **kwargs}
    if cls is LayerWiseOptimizer:
        return cls, kwargs
    signature = inspect.signature(cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.values()):
        accepted = [p for p in signature if p not in ("self", "params", "model")]
        unknown = sorted(set(extra) - set(accepted))
        if unknown:
            raise ValueError(
                f"optim_args {unknown} not accepted by {cls.__name__} (optim={name!r}); accepted: {accepted}"
            )
    return cls, kwargs


# ----------------------------------------------------------------------------- checkpointable state
# Checkpoints are read with torch.load(weights_only=True), which refuses the objects some optimizers
# keep in their state: torchao's quantized state tensors (tensor subclasses) and GaLore/APOLLO
# projectors (plain Python objects). They are written as tagged dicts of tensors and plain values,
# and rebuilt on load only for classes of these packages.
_TAG = "__trainwright_state_object__"
_TENSOR_SUBCLASS_MODULES = ("torchao.optim.",)
_OBJECT_MODULES = ("galore_torch.", "apollo_torch.")


def _qualname(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _plain_ctx(item: Any) -> Any:
    if isinstance(item, torch.dtype):
        return {"dtype": str(item).removeprefix("torch.")}
    if isinstance(item, torch.Size):
        return {"size": list(item)}
    return item


def _ctx_value(item: Any) -> Any:
    if isinstance(item, dict) and "dtype" in item:
        return getattr(torch, item["dtype"])
    if isinstance(item, dict) and "size" in item:
        return torch.Size(item["size"])
    return item


def _to_plain(value: Any) -> Any:
    kind = type(value).__module__
    if isinstance(value, torch.Tensor) and kind.startswith(_TENSOR_SUBCLASS_MODULES):
        # torchao's tensor subclasses implement torch's traceable-subclass protocol (not in Tensor's type)
        names, ctx = cast(Any, value).__tensor_flatten__()
        return {
            _TAG: _qualname(value),
            "tensors": {name: getattr(value, name) for name in names},
            "ctx": [_plain_ctx(c) for c in ctx],
            "size": list(value.shape),
            "stride": list(value.stride()),
        }
    if kind.startswith(_OBJECT_MODULES) and hasattr(value, "__dict__"):
        return {_TAG: _qualname(value), "attributes": dict(vars(value))}
    return value


def _from_plain(value: Any) -> Any:
    if not (isinstance(value, dict) and _TAG in value):
        return value
    module_name, _, class_name = value[_TAG].rpartition(".")
    if not module_name.startswith(_TENSOR_SUBCLASS_MODULES + _OBJECT_MODULES):
        raise ValueError(f"optimizer state names {value[_TAG]!r}, which trainwright does not rebuild")
    cls = getattr(importlib.import_module(module_name), class_name)
    if "tensors" in value:
        ctx = [_ctx_value(c) for c in value["ctx"]]
        return cls.__tensor_unflatten__(
            value["tensors"], ctx, torch.Size(value["size"]), tuple(value["stride"])
        )
    obj = cls.__new__(cls)
    obj.__dict__.update(value["attributes"])
    return obj


def _state_to_plain(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    # new dicts: the per-parameter dicts of state_dict() are the optimizer's live state
    state = {k: {n: _to_plain(v) for n, v in s.items()} for k, s in state_dict["state"].items()}
    return {**state_dict, "state": state}


def _state_from_plain(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    state = {k: {n: _from_plain(v) for n, v in s.items()} for k, s in state_dict["state"].items()}
    return {**state_dict, "state": state}


def _grok_state_out(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    # GrokAdamW keeps its state in group["state"], keyed by the parameter tensors: written as a
    # list in the group's parameter order
    for live, packed in zip(optimizer.param_groups, state_dict["param_groups"]):
        packed["state"] = [live["state"].get(p, {}) for p in live["params"]]
    return state_dict


def _grok_state_in(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:  # after loading: key the list back by the live parameters
        if isinstance(group.get("state"), list):
            group["state"] = {p: s for p, s in zip(group["params"], group["state"]) if s}


def make_checkpointable(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Let the optimizer's state_dict() be saved and read with weights_only, and its param groups
    have from the start the keys that stepping adds, so that a checkpoint matches a fresh optimizer.

    torchao's state tensors and GaLore/APOLLO projectors become plain data; GrokAdamW's in-group
    state is listed by parameter order; optimi's StableAdamW gets the `step` its first step resets.
    """
    module = type(optimizer).__module__
    if module.startswith(("torchao.", "galore_torch.", "apollo_torch.")):
        optimizer.register_state_dict_post_hook(_state_to_plain)
        optimizer.register_load_state_dict_pre_hook(_state_from_plain)
    elif module.startswith("grokadamw"):
        for group in optimizer.param_groups:
            group.setdefault("state", {})  # what its first step adds
        optimizer.register_state_dict_post_hook(_grok_state_out)
        optimizer.register_load_state_dict_post_hook(_grok_state_in)
    elif module.startswith("optimi.") and type(optimizer).__name__ == "StableAdamW":
        for group in optimizer.param_groups:
            # the first step (group["setup"] False) sets it to 0 again
            group.setdefault("step", torch.tensor(0, dtype=torch.int32))
    return optimizer


class LayerWiseOptimizer(torch.optim.Optimizer):
    """One optimizer per parameter, stepped as soon as that parameter's gradient is accumulated.

    `step()` and `zero_grad()` do nothing (the hooks did the work). `param_groups` are the inner
    optimizers' own group dicts, so an LR scheduler built on this optimizer sets every inner
    learning rate. `state_dict()` holds each inner optimizer's state, in parameter order.
    """

    def __init__(self, optimizer_dict: dict[nn.Parameter, torch.optim.Optimizer], lr: float | None = None):
        self.optimizer_dict = optimizer_dict
        for optimizer in optimizer_dict.values():
            make_checkpointable(optimizer)
        super().__init__(self._inner_groups(), {})
        self._hooks = [p.register_post_accumulate_grad_hook(self._step_one) for p in optimizer_dict]

    def _inner_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizer_dict.values() for g in opt.param_groups]

    def _step_one(self, param: nn.Parameter) -> None:
        optimizer = self.optimizer_dict[param]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # ignore[override]: the steps happen in the gradient hooks, so a closure is not run and no loss
    # is returned, unlike Optimizer.step(closure) -> float
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        # param_groups as torch writes them (for checks of the layout); the state lives in "layerwise"
        return {
            **super().state_dict(),
            "layerwise": [opt.state_dict() for opt in self.optimizer_dict.values()],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict["layerwise"]
        if len(states) != len(self.optimizer_dict):
            raise ValueError(
                f"layer-wise optimizer state has {len(states)} entries for {len(self.optimizer_dict)} parameters"
            )
        for opt, state in zip(self.optimizer_dict.values(), states):
            opt.load_state_dict(state)
        self.param_groups = self._inner_groups()  # loading replaced the inner group dicts

    def remove_hooks(self) -> None:
        """Stop stepping inside the backward (for a model that is trained on with another optimizer)."""
        for hook in self._hooks:
            hook.remove()


def lomo_backward(optimizer: Any, loss: torch.Tensor) -> None:
    """Backward of a LOMO/AdaLOMO optimizer: updates the weights at the current group learning rate.

    With `clip_grad_norm` set, LOMO needs a first backward pass to measure the gradient norm.
    """
    if optimizer.clip_grad_norm is not None and optimizer.clip_grad_norm > 0:
        optimizer.grad_norm(loss)
    optimizer.fused_backward(loss, optimizer.param_groups[0]["lr"])


def is_fused_backward(optimizer: Any) -> bool:
    """Whether `optimizer` updates the weights inside the backward (LOMO, AdaLOMO)."""
    return callable(getattr(optimizer, "fused_backward", None))

"""transformers' v4 and v5 `TrainingArguments` side by side: where they differ, which behaviour
trainwright follows (`V4_V5_CHOICES`), and the old (v4) argument names mapped onto the new fields.

An old name given a value other than its v4 default warns once per process (`FutureWarning`, at the
caller's line) and moves its value onto the new field; the old field keeps what was given, so v4
code reads back what it set.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from types import FrameType
from typing import Any, TypeVar, cast

from trainwright.args.checks import choice, invalid, words
from trainwright.core.enums import IntervalStrategy

V4_V5_CHOICES: dict[str, str] = {
    "report_to": 'Default "none" (v5). v4\'s default meant every installed integration; pass "all" for that. '
    'None is read as "none". The list is kept as given (["all"] stays) for the reporter registry to expand.',
    "optim": 'Default "adamw_torch_fused" (v5 on recent torch); the optimizer factory falls back to the '
    'foreach kernel where fused is unsupported. "adamw_hf" (old v4 default) is read as "adamw_torch".',
    "lr_scheduler_kwargs": "Default {} (v4) rather than None (v5), so v4 code that updates the dict keeps working.",
    "warmup_steps": "v5 semantics: an int is a step count, a float in (0, 1) a fraction of the training steps.",
    "warmup_ratio": "Kept from v4 (warns once when non-zero): used when warmup_steps is 0. Giving it together "
    "with a fractional warmup_steps is an error; an integer warmup_steps > 0 wins, as in v4. None is unset "
    "(sentence-transformers declares it so).",
    "include_num_input_tokens_seen": 'Default "no" (v5); v4 booleans are coerced (True -> "all", False -> "no").',
    "activation_checkpointing": "v5 name; gradient_checkpointing (v4) is its alias and mirrors it after "
    "construction. When both are given, the v5 name wins.",
    "train_sampling_strategy": "v5 field (random/sequential/group_by_length); v4 group_by_length=True maps to "
    '"group_by_length". v5\'s "batch_rebalance" is not provided.',
    "logging_dir": "Kept (v4) but left None by default, as in v5: the TensorBoard reporter then uses "
    "TENSORBOARD_LOGGING_DIR or output_dir/runs/<time>_<host>. v4 filled it in at construction.",
    "save_safetensors": "Removed in v5, as there: no such attribute, so code that reads "
    '`getattr(args, "save_safetensors", default)` gets its default (GLiNER then writes pytorch_model.bin, as '
    "on transformers 5). v4 scripts may still pass it to trainwright's own argument classes: True (v4's "
    "default) is accepted and not kept; False is refused (trainwright itself writes safetensors only).",
    "run_name": "Default None (v5); v4 documented output_dir as the default.",
    "trackio_space_id": 'Default None (v5); v4\'s default "trackio" is read (v4 training_args.json files) but any '
    "other value is refused, like project and the other trackio_* fields: trainwright has no trackio reporter.",
    "accelerator_config": (
        "An AcceleratorConfig (accelerator_config.py), read by attribute or as a dict: a dict, JSON "
        "string, JSON file path or transformers' AcceleratorConfig. What each setting does and what is "
        "refused is one list (see below: accelerator_config: honoured and refused)."
    ),
    "fsdp": 'Normalised to a list of FSDPOption words (v4 style); True means ["full_shard"]. FSDP runs on '
    'PyTorch\'s FSDP2 (fully_shard); fsdp_config keys lose a leading "fsdp_".',
    "debug": "Normalised to a list of DebugOption (a space-separated string is split), as in both versions.",
    "tf32": "Only recorded: building the arguments never changes torch's global TF32 flags (v5 does, "
    "and raises without an Ampere GPU); applying it belongs to whatever starts training.",
    "bf16": "Hardware support is checked when the Trainer is built, not at construction of the arguments, "
    "which never touches a device (v5 initialises the device inside TrainingArguments): as upstream, bf16 on "
    "a machine without a bfloat16 GPU is refused unless use_cpu=True (the CPU autocasts in bfloat16).",
    "half_precision_backend": 'Accepted (v4); trainwright always uses torch.amp, so values other than "auto" '
    "warn and change nothing. fp16_backend (older v4) maps onto it.",
    "enable_jit_checkpoint": "v5 (default False there: no signal checkpoint). trainwright keeps its "
    "guarantee by default: not set (None), training saves and stops on SIGTERM, SIGUSR1 and SIGINT; "
    "True does the same; an explicit False turns it off. preemption_signals names the signals and then wins.",
    "evaluation_strategy": "Old name of eval_strategy (v4 < 4.46): maps onto it with a warning.",
    "per_gpu_train_batch_size": "Old name (v4): maps onto per_device_train_batch_size with a warning "
    "(likewise per_gpu_eval_batch_size).",
    "no_cuda": "Old name (v4): maps onto use_cpu with a warning. use_mps_device is ignored with a warning "
    "(MPS is picked automatically).",
    "adafactor": 'Old flag (v4): maps onto optim="adafactor" with a warning.',
    "include_inputs_for_metrics": 'Old flag (v4): adds "inputs" to include_for_metrics with a warning.',
    "include_tokens_per_second": (
        "Kept (v4): adds train_tokens_per_second (input_ids tokens of this train() call over its runtime) "
        "to the final train metrics. v5's per-row train_tokens_per_second comes with include_num_input_tokens_seen."
    ),
    "torchdynamo": "Old name (v4): maps onto torch_compile_backend with a warning.",
    "push_to_hub_model_id": "Old names (v4) push_to_hub_model_id/_organization/_token map onto hub_model_id "
    "and hub_token with a warning.",
    "fsdp_min_num_params": "Old names (v4) fsdp_min_num_params and fsdp_transformer_layer_cls_to_wrap move "
    "into fsdp_config with a warning.",
    "tpu_metrics_debug": (
        'Old flag (v4): adds "tpu_metrics_debug" to debug with a warning. The Trainer refuses that option: '
        "trainwright does not run on TPUs (torch_xla), whose metrics it would print."
    ),
    "jit_mode_eval": "Removed in v5; the default is accepted, any other value is refused naming the field "
    "(likewise use_legacy_prediction_loop, fp16_opt_level, tpu_num_cores, mp_parameters, "
    "half_precision_backend='apex', save_safetensors=False): trainwright cannot honour them.",
    "overwrite_output_dir": "Kept (v4, removed in v5) for scripts that read it; the Trainer does not use it.",
    "past_index": (
        "Honoured as in v4 (removed in v5): the output at past_index is fed back as `mems`, the memory starting "
        "empty each epoch and each evaluation; an evaluation during training leaves the training memory as it was."
    ),
    "ray_scope": "Kept (v4, removed in v5) for hyperparameter-search backends.",
    "parallelism_config": (
        "Honoured on PyTorch's own engine (DeviceMesh, tensor-parallel plan, FSDP2/HSDP); cp_size > 1 "
        "on CUDA (PyTorch's context parallelism; refused on the CPU, which has no context-parallel rule "
        "for its SDPA kernel); sp_size > 1 (DeepSpeed Ulysses) and enable_async_tp are refused (see "
        "below: parallelism_config)."
    ),
    "save_total_limit": "Must be >= 1 when given (None keeps every checkpoint); upstream silently treats 0 as None.",
}


# ------------------------------------------------------------------------------ removed v4 arguments

# v4 arguments that transformers 5 removed, taken by trainwright's own argument classes at the one value
# it honours (name -> (that value, why another is refused)) but not kept: code written for v5 tests
# `getattr(args, name, default)` (GLiNER picks its weight format so) and must get v5's answer.
REMOVED_V4_ARGS: dict[str, tuple[Any, str]] = {
    "save_safetensors": (
        True,
        "trainwright writes weights as safetensors only (never pytorch_model.bin, a pickle-format file)",
    ),
}


_Args = TypeVar("_Args", bound=type)


def takes_removed_v4_args(cls: _Args) -> _Args:
    """`cls` (a dataclass) whose constructor also takes `REMOVED_V4_ARGS` (a v4 script's
    `save_safetensors=True`), without making them fields: the instance has no such attribute, as a
    transformers 5 one has none. A library's own subclass is built by its own dataclass `__init__`,
    which refuses them, as on transformers 5."""
    init = cls.__dict__["__init__"]  # the dataclass's own

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name, (honoured, why) in REMOVED_V4_ARGS.items():
            if name in kwargs and (value := kwargs.pop(name)) != honoured:
                raise invalid(self, name, why, value)
        init(self, *args, **kwargs)

    setattr(cls, "__init__", __init__)  # noqa: B010  (mypy refuses assigning a method)
    return cls


# ------------------------------------------------------------------------------ warning once

_WARNED: set[str] = set()
# Frames skipped to find the caller: the modules that build TrainingArguments, and the
# dataclass-generated __init__ (compiled from "<string>").
_HERE = os.path.dirname(os.path.abspath(__file__))
_OWN_FILES = frozenset(
    {"<string>", __file__}
    | {os.path.join(_HERE, f"{m}.py") for m in ("training_args", "validation", "checks", "properties")}
)


def warn_once(key: str, message: str) -> None:
    """Emit a FutureWarning the first time `key` is seen in this process, pointing at the caller's line."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    level = 2
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _OWN_FILES:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, FutureWarning, stacklevel=level)


def _mps_available() -> bool:
    import torch

    return bool(torch.backends.mps.is_available())


# v4 options trainwright cannot act on: name -> (v4 default, why); a non-default value is refused.
NO_EFFECT = {
    "jit_mode_eval": (False, "torch.jit tracing for evaluation is not provided"),
    "use_legacy_prediction_loop": (False, "there is a single evaluation loop"),
    "fp16_opt_level": ("O1", "apex is not used; mixed precision is torch.amp"),
    "tpu_num_cores": (None, "TPUs are not supported"),
    "mp_parameters": ("", "SageMaker model parallelism is not supported"),
    "use_mps_device": (False, "MPS is picked automatically when available"),
}


# ------------------------------------------------------------------------------ old names


def take_old(args: Any, old: str, v4_default: Any, new: str | None) -> Any:
    """Return the value given under the old name `old` (None if unset or the v4 default). The old
    field keeps it, so v4 code reads back what it set (`args.no_cuda` stays True)."""
    value = getattr(args, old)
    if value is None or value == v4_default:
        return None
    target = f"; use {new} instead" if new else ""
    warn_once(old, f"{old} is an old (transformers v4) argument name{target}.")
    return value


def merge_old(args: Any, old: str, new: str, value: Any, new_default: Any) -> None:
    """Put the old name's value into `new`, unless `new` was also set to something else."""
    current = getattr(args, new)
    if current is None or current == new_default:
        setattr(args, new, value)
    elif current != value:
        raise ValueError(
            f"{type(args).__name__}: {old}={value!r} (old name) and {new}={current!r} disagree; give only {new}"
        )


def resolve_old_names(args: Any) -> None:
    if (v := take_old(args, "evaluation_strategy", "no", "eval_strategy")) is not None:
        merge_old(
            args,
            "evaluation_strategy",
            "eval_strategy",
            choice(args, "evaluation_strategy", IntervalStrategy, v),
            "no",
        )
    for kind in ("train", "eval"):
        old, new = f"per_gpu_{kind}_batch_size", f"per_device_{kind}_batch_size"
        if (v := take_old(args, old, None, new)) is not None:
            merge_old(args, old, new, v, 8)
    if take_old(args, "no_cuda", False, "use_cpu"):
        args.use_cpu = True
    if take_old(args, "adafactor", False, 'optim="adafactor"'):
        merge_old(args, "adafactor", "optim", "adafactor", "adamw_torch_fused")
    if (v := take_old(args, "fp16_backend", "auto", "half_precision_backend")) is not None:
        merge_old(args, "fp16_backend", "half_precision_backend", v, "auto")
    if (v := take_old(args, "torchdynamo", None, "torch_compile_backend")) is not None:
        merge_old(args, "torchdynamo", "torch_compile_backend", v, None)
    if take_old(args, "group_by_length", False, 'train_sampling_strategy="group_by_length"'):
        merge_old(args, "group_by_length", "train_sampling_strategy", "group_by_length", "random")
    if take_old(args, "include_inputs_for_metrics", False, 'include_for_metrics=["inputs"]'):
        args.include_for_metrics = [*(args.include_for_metrics or []), "inputs"]
    if take_old(args, "tpu_metrics_debug", False, 'debug="tpu_metrics_debug"'):
        args.debug = list(dict.fromkeys([*words(args.debug), "tpu_metrics_debug"]))
    _resolve_old_hub_names(args)
    _resolve_old_fsdp_names(args)
    _refuse_what_has_no_effect(args)
    _sync_checkpointing_names(args)


def _resolve_old_fsdp_names(args: Any) -> None:
    if (v := take_old(args, "fsdp_min_num_params", 0, 'fsdp_config["min_num_params"]')) is not None:
        cast(dict[str, Any], args.fsdp_config).setdefault("min_num_params", v)  # a dict by now
    if (v := take_old(args, "fsdp_transformer_layer_cls_to_wrap", None, "fsdp_config")) is not None:
        cast(dict[str, Any], args.fsdp_config).setdefault("transformer_layer_cls_to_wrap", v)


def _refuse_what_has_no_effect(args: Any) -> None:
    """Old fields trainwright cannot honour: refused unless left at their v4 default."""
    for name, (v4_default, why) in NO_EFFECT.items():
        if getattr(args, name) == v4_default:
            continue
        if name == "use_mps_device" and _mps_available():
            warn_once(name, f"use_mps_device is not needed: {why}.")
            continue
        raise invalid(args, name, f"trainwright cannot honour it: {why}; leave it at {v4_default!r}")


def _resolve_old_hub_names(args: Any) -> None:
    if (v := take_old(args, "push_to_hub_token", None, "hub_token")) is not None:
        merge_old(args, "push_to_hub_token", "hub_token", v, None)
    model_id = take_old(args, "push_to_hub_model_id", None, "hub_model_id")
    organization = take_old(args, "push_to_hub_organization", None, "hub_model_id")
    if organization is not None:
        assert args.output_dir is not None  # _resolve_paths ran first
        model_id = f"{organization}/{model_id or os.path.basename(args.output_dir.rstrip('/'))}"
    if model_id is not None:
        merge_old(args, "push_to_hub_model_id", "hub_model_id", model_id, None)


def _sync_checkpointing_names(args: Any) -> None:
    # The v5 name wins when given; the v4 name then mirrors it so code reading either agrees.
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if getattr(args, new) is None:
            value = getattr(args, old)
            if value:
                warn_once(old, f"{old} is the v4 name of {new}; use {new} instead.")
            setattr(args, new, value)
        setattr(args, old, getattr(args, new))
    args.activation_checkpointing = args.gradient_checkpointing = bool(args.activation_checkpointing)

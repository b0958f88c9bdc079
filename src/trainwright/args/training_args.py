"""`TrainingArguments` and `Seq2SeqTrainingArguments`: the settings of a run, validated when built.

Every argument name of transformers' v4 (4.57) and v5 (5.23) `TrainingArguments` is accepted.
Old (v4) names that were renamed upstream warn once (`FutureWarning`) when given a value other than
their v4 default, and are mapped onto the new field; after construction the old field holds its
v4 default again, so `to_dict()` and a rebuild from it stay consistent. Where v4 and v5 disagree,
`V4_V5_CHOICES` says which behaviour trainwright follows.

Construction touches no device and no process group: `device`, `world_size`, `should_save` and
friends ask `trainwright.distributed.runtime.get_runtime` the first time they are read.
"""

import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import math
import numbers
import os
import signal
import sys
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import FrameType
from typing import Any, cast

import torch

from trainwright.args.accelerator_config import AcceleratorConfig
from trainwright.checkpoint.files import parse_size
from trainwright.core.enums import (
    FSDP_SHARDING_STRATEGIES,
    DebugOption,
    EvaluationStrategy,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
)
from trainwright.distributed import runtime as runtime_module

__all__ = [
    "V4_V5_CHOICES",
    "DebugOption",
    "EvaluationStrategy",
    "FSDPOption",
    "HubStrategy",
    "IntervalStrategy",
    "OptimizerNames",
    "ParallelMode",
    "SaveStrategy",
    "SchedulerType",
    "Seq2SeqTrainingArguments",
    "TrainingArguments",
]

logger = logging.getLogger(__name__)

V4_V5_CHOICES: dict[str, str] = {
    "report_to": 'Default "none" (v5). v4\'s default meant every installed integration; pass "all" for that. '
    'None is read as "none". The list is kept as given (["all"] stays) for the reporter registry to expand.',
    "optim": 'Default "adamw_torch_fused" (v5 on recent torch); the optimizer factory falls back to the '
    'foreach kernel where fused is unsupported. "adamw_hf" (old v4 default) is read as "adamw_torch".',
    "lr_scheduler_kwargs": "Default {} (v4) rather than None (v5), so v4 code that updates the dict keeps working.",
    "warmup_steps": "v5 semantics: an int is a step count, a float in (0, 1) a fraction of the training steps.",
    "warmup_ratio": "Kept from v4 (warns once when non-zero): used when warmup_steps is 0. Giving it together "
    "with a fractional warmup_steps is an error; an integer warmup_steps > 0 wins, as in v4.",
    "include_num_input_tokens_seen": 'Default "no" (v5); v4 booleans are coerced (True -> "all", False -> "no").',
    "activation_checkpointing": "v5 name; gradient_checkpointing (v4) is its alias and mirrors it after "
    "construction. When both are given, the v5 name wins.",
    "train_sampling_strategy": "v5 field (random/sequential/group_by_length); v4 group_by_length=True maps to "
    '"group_by_length". v5\'s "batch_rebalance" is not provided.',
    "logging_dir": "Kept (v4) but left None by default, as in v5: the TensorBoard reporter then uses "
    "TENSORBOARD_LOGGING_DIR or output_dir/runs/<time>_<host>. v4 filled it in at construction.",
    "save_safetensors": "Always True: weights are always written as safetensors (nothing is pickled). "
    "False is ignored with a warning.",
    "run_name": "Default None (v5); v4 documented output_dir as the default.",
    "trackio_space_id": 'Default None (v5); v4\'s default "trackio" is read (v4 training_args.json files) but any '
    "other value is refused, like project and the other trackio_* fields: trainwright has no trackio reporter.",
    "accelerator_config": "An AcceleratorConfig (accelerator_config.py), read by attribute or as a dict; a dict, "
    "JSON string, JSON file path or transformers' AcceleratorConfig is read; unknown keys are an error. "
    "non_blocking and gradient_accumulation_kwargs (num_steps, sync_each_batch) are honoured; split_batches, "
    "dispatch_batches=True, even_batches=False, use_seedable_sampler=False, use_configured_state are refused.",
    "fsdp": 'Normalised to a list of FSDPOption words (v4 style); True means ["full_shard"]. FSDP runs on '
    'PyTorch\'s FSDP2 (fully_shard); fsdp_config keys lose a leading "fsdp_".',
    "debug": "Normalised to a list of DebugOption (a space-separated string is split), as in both versions.",
    "tf32": "Only recorded: building the arguments never changes torch's global TF32 flags (v5 does, "
    "and raises without an Ampere GPU); applying it belongs to whatever starts training.",
    "bf16": "Hardware support is not checked at construction, which never touches a device (v5 "
    "initialises the device inside TrainingArguments); runtime.bf16_supported() answers it.",
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
    "parallelism_config": "Accepted as a name (v5); a value is an error: accelerate's ParallelismConfig is "
    "not supported.",
    "lr_scheduler_type": 'v5\'s "greedy" schedule is not provided.',
    "save_total_limit": "Must be >= 1 when given (None keeps every checkpoint); upstream silently treats 0 as None.",
}

# ----------------------------------------------------------------------------------------- helpers

_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    """Emit a FutureWarning the first time `key` is seen in this process, pointing at the caller's line."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    # Skip the frames of this module and of the dataclass-generated __init__ (compiled from "<string>").
    level = 2
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in (__file__, "<string>"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, FutureWarning, stacklevel=level)


def _arg(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, **meta: Any) -> Any:
    """A dataclass field whose metadata carries its one-line help (and argparse choices)."""
    metadata = {"help": help, **meta}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _jsonable(value: Any) -> Any:
    """Turn enums, dtypes, paths, tuples and config objects into plain JSON values."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return _jsonable(value.to_dict())
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _words(value: Any) -> list[Any]:
    """Split "a b,c" or ["a b", "c"] into words; enum members and non-strings pass through."""
    items = [value] if isinstance(value, str) else list(value or [])
    words: list[Any] = []
    for item in items:
        is_plain_str = isinstance(item, str) and not isinstance(item, Enum)
        words.extend(item.replace(",", " ").split() if is_plain_str else [item])
    return words


def _redacted(name: str) -> str:
    return f"<{name.upper()}>"


_LOG_LEVELS = {
    "detail": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "passive": -1,
}
_SAMPLING_STRATEGIES = ["random", "sequential", "group_by_length"]
_TOKENS_SEEN = ["no", "all", "non_padding"]
_METRIC_INPUTS = ["inputs", "loss"]
_HALF_PRECISION_BACKENDS = ["auto", "apex", "cpu_amp"]
_DDP_BACKENDS = ["nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl", "ccl"]
_MP_CONTEXTS = ["fork", "spawn", "forkserver"]
# The fields of transformers' AcceleratorConfig, with its defaults.
_DICT_FIELDS = (
    "lr_scheduler_kwargs",
    "fsdp_config",
    "deepspeed",
    "accelerator_config",
    "gradient_checkpointing_kwargs",
    "activation_checkpointing_kwargs",
    "liger_kernel_config",
)
# Dict fields where a string that is not JSON names a file: read here, or (deepspeed) kept as a path.
_DEFAULT_PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
_DICT_FILE_FIELDS = ("fsdp_config", "accelerator_config", "deepspeed")


def _mps_available() -> bool:
    import torch

    return bool(torch.backends.mps.is_available())


# v4 options trainwright cannot act on: name -> (v4 default, why); a non-default value is refused.
_NO_EFFECT = {
    "jit_mode_eval": (False, "torch.jit tracing for evaluation is not provided"),
    "use_legacy_prediction_loop": (False, "there is a single evaluation loop"),
    "fp16_opt_level": ("O1", "apex is not used; mixed precision is torch.amp"),
    "tpu_num_cores": (None, "TPUs are not supported"),
    "mp_parameters": ("", "SageMaker model parallelism is not supported"),
    "use_mps_device": (False, "MPS is picked automatically when available"),
}


# ------------------------------------------------------------------------------- the dataclass


@dataclass(repr=False)
class TrainingArguments:
    """Everything that configures a `Trainer` run; validated in `__post_init__`.

    Field help is in each field's metadata (the command-line parser shows it). Choice-valued
    fields become `str` enums that compare equal to their string values.
    """

    # -- output and phases ---------------------------------------------------------------------
    output_dir: str | None = _arg(None, 'Where checkpoints and outputs go (default "trainer_output").')
    overwrite_output_dir: bool = _arg(False, "v4: allow reusing a non-empty output_dir (read by scripts).")
    do_train: bool = _arg(False, "Whether to run training (read by scripts).")
    do_eval: bool = _arg(False, "Whether to evaluate; set automatically when eval_strategy is not 'no'.")
    do_predict: bool = _arg(False, "Whether to predict on a test set (read by scripts).")
    resume_from_checkpoint: str | None = _arg(None, "Checkpoint folder for scripts to pass to train().")

    # -- batches and length of training ------------------------------------------------------------
    per_device_train_batch_size: int = _arg(8, "Training batch size per device (process).")
    per_device_eval_batch_size: int = _arg(8, "Evaluation batch size per device (process).")
    gradient_accumulation_steps: int = _arg(1, "Micro-batches accumulated per optimizer step.")
    eval_accumulation_steps: int | None = _arg(None, "Evaluation steps before moving outputs to the CPU.")
    auto_find_batch_size: bool = _arg(False, "Halve the batch size and retry on out-of-memory errors.")
    num_train_epochs: float = _arg(3.0, "Number of training epochs (may be fractional).")
    max_steps: int = _arg(-1, "If > 0: number of optimizer steps to run; overrides num_train_epochs.")

    # -- optimizer and schedule ----------------------------------------------------------------------
    learning_rate: float = _arg(5e-5, "Initial (peak) learning rate.")
    weight_decay: float = _arg(0.0, "Weight decay, applied to all but bias and normalisation weights.")
    adam_beta1: float = _arg(0.9, "Beta1 of Adam-type optimizers.")
    adam_beta2: float = _arg(0.999, "Beta2 of Adam-type optimizers.")
    adam_epsilon: float = _arg(1e-8, "Epsilon of Adam-type optimizers.")
    max_grad_norm: float = _arg(1.0, "Gradient clipping norm (<= 0 disables clipping).")
    optim: OptimizerNames | str = _arg("adamw_torch_fused", "Optimizer name.")
    optim_args: str | None = _arg(None, 'Extra optimizer arguments as "key=value,key=value".')
    optim_target_modules: list[str] | str | None = _arg(
        None, "Modules targeted by the optimizer, if it needs them."
    )
    lr_scheduler_type: SchedulerType | str = _arg("linear", "Learning-rate schedule.")
    lr_scheduler_kwargs: dict[str, Any] | str | None = _arg(
        None, "Extra schedule arguments (dict or JSON string).", factory=dict
    )
    warmup_steps: float = _arg(0, "Warmup steps (int), or a fraction of the training steps (float < 1).")
    warmup_ratio: float = _arg(
        0.0, "v4: warmup as a fraction of the training steps (used if warmup_steps is 0)."
    )
    label_smoothing_factor: float = _arg(0.0, "Label smoothing epsilon (0 disables it).")
    average_tokens_across_devices: bool = _arg(
        True, "Normalise the loss by the token count over all processes."
    )
    neftune_noise_alpha: float | None = _arg(None, "NEFTune noise scale for embeddings (None disables it).")

    # -- precision, memory and compilation -------------------------------------------------------
    bf16: bool = _arg(False, "Train with bfloat16 autocast.")
    fp16: bool = _arg(False, "Train with float16 autocast and gradient scaling.")
    bf16_full_eval: bool = _arg(False, "Evaluate with the model cast to bfloat16.")
    fp16_full_eval: bool = _arg(False, "Evaluate with the model cast to float16.")
    half_precision_backend: str = _arg(
        "auto",
        "v4: half-precision backend (trainwright always uses torch.amp).",
        choices=_HALF_PRECISION_BACKENDS,
    )
    tf32: bool | None = _arg(None, "Allow TF32 matmuls on Ampere+ GPUs (None leaves torch's setting).")
    activation_checkpointing: bool | None = _arg(
        None, "Recompute activations in backward to save memory (v5)."
    )
    activation_checkpointing_kwargs: dict[str, Any] | str | None = _arg(
        None, "Arguments of activation checkpointing (dict or JSON string)."
    )
    gradient_checkpointing: bool = _arg(False, "v4 name of activation_checkpointing.")
    gradient_checkpointing_kwargs: dict[str, Any] | str | None = _arg(
        None, "v4 name of activation_checkpointing_kwargs."
    )
    torch_compile: bool = _arg(False, "Compile the model with torch.compile.")
    torch_compile_backend: str | None = _arg(
        None, 'torch.compile backend (implies torch_compile; "inductor").'
    )
    torch_compile_mode: str | None = _arg(None, "torch.compile mode (implies torch_compile).")
    torch_empty_cache_steps: int | None = _arg(None, "Empty the device cache every N steps (None: never).")
    use_liger_kernel: bool = _arg(False, "Patch the model with Liger kernels (needs liger-kernel).")
    liger_kernel_config: dict[str, bool] | None = _arg(None, "Which Liger kernels to apply.")
    use_cache: bool = _arg(False, "Value written to model.config.use_cache during training.")

    # -- logging -------------------------------------------------------------------------------------
    logging_strategy: IntervalStrategy | str = _arg("steps", "When to log: no, steps or epoch.")
    logging_steps: float = _arg(500, "Log every N steps (int), or every fraction of the run (float < 1).")
    logging_first_step: bool = _arg(False, "Also log after the first optimizer step.")
    logging_nan_inf_filter: bool = _arg(True, "Leave NaN/inf losses out of the logged average.")
    logging_dir: str | None = _arg(None, "v4: TensorBoard log folder (None: output_dir/runs/<time>_<host>).")
    log_on_each_node: bool = _arg(True, "Log from the main process of every node, not only the first.")
    log_level: str = _arg("passive", "Log level on the main process.", choices=list(_LOG_LEVELS))
    log_level_replica: str = _arg("warning", "Log level on the other processes.", choices=list(_LOG_LEVELS))
    disable_tqdm: bool | None = _arg(None, "Hide progress bars (default: when logging is above WARNING).")
    include_num_input_tokens_seen: str | bool = _arg(
        "no", 'Count input tokens seen: "no", "all" or "non_padding".'
    )
    include_tokens_per_second: bool = _arg(False, "v4: add tokens per second to the speed metrics.")
    skip_memory_metrics: bool = _arg(True, "Skip the *_mem_* memory metrics.")
    report_to: list[str] | str | None = _arg("none", 'Reporters: names, "all" or "none".')
    run_name: str | None = _arg(None, "Run name shown by reporters.")
    project: str = _arg("huggingface", "Trackio project (refused: no trackio reporter).")
    trackio_space_id: str | None = _arg(None, "Trackio Space id (refused: no trackio reporter).")
    trackio_bucket_id: str | None = _arg(None, "Trackio bucket id (refused: no trackio reporter).")
    trackio_static_space_id: str | bool | None = _arg(None, "Trackio static Space id (refused).")

    # -- evaluation ------------------------------------------------------------------------------------
    eval_strategy: IntervalStrategy | str = _arg("no", "When to evaluate: no, steps or epoch.")
    eval_steps: float | None = _arg(
        None, "Evaluate every N steps (int) or fraction (float < 1); default logging_steps."
    )
    eval_delay: float = _arg(0, "Steps (or epochs) to wait before the first evaluation.")
    eval_on_start: bool = _arg(False, "Evaluate once before training starts.")
    prediction_loss_only: bool = _arg(False, "Only return the loss from evaluate/predict.")
    eval_do_concat_batches: bool = _arg(True, "Concatenate predictions across batches.")
    eval_use_gather_object: bool = _arg(False, "Gather nested Python objects across processes.")
    include_for_metrics: list[str] = _arg(
        None, 'Extra inputs of compute_metrics: "inputs", "loss".', factory=list
    )
    batch_eval_metrics: bool = _arg(False, "Call compute_metrics per batch (with compute_result).")
    label_names: list[str] | None = _arg(None, "Keys of the batch that hold labels.")
    past_index: int = _arg(-1, "v4: index of model outputs holding past state fed back as `mems`.")

    # -- checkpoints -----------------------------------------------------------------------------------
    save_strategy: SaveStrategy | str = _arg("steps", "When to save: no, steps, epoch or best.")
    save_steps: float = _arg(500, "Save every N steps (int), or every fraction of the run (float < 1).")
    save_total_limit: int | None = _arg(None, "Keep at most this many checkpoints (plus the best one).")
    save_safetensors: bool = _arg(True, "v4: always True (weights are always safetensors).")
    save_on_each_node: bool = _arg(False, "Write checkpoints on every node (no shared filesystem).")
    save_only_model: bool = _arg(False, "Save only the model (no optimizer/scheduler/RNG: no resume).")
    save_max_shard_size: str = _arg("5GB", "Largest safetensors shard, e.g. '5GB', '500MiB'.")
    preemption_signals: list[str] = _arg(
        None,
        "Signals on which training saves a checkpoint and stops (default: SIGTERM, SIGUSR1 and SIGINT, "
        "unless enable_jit_checkpoint=False; [] turns it off).",
    )
    enable_jit_checkpoint: bool | None = _arg(
        None,
        "v5: save a checkpoint at the end of the step on a preemption signal and stop. Not set: on "
        "(trainwright's default signals); False: off, unless preemption_signals names signals.",
    )
    restore_callback_states_from_checkpoint: bool = _arg(False, "Restore stateful callbacks on resume.")
    load_best_model_at_end: bool = _arg(False, "Load the best checkpoint when training ends.")
    metric_for_best_model: str | None = _arg(None, 'Metric that ranks checkpoints (default "loss").')
    greater_is_better: bool | None = _arg(None, "Whether a larger metric is better (default: not a loss).")
    ignore_data_skip: bool = _arg(False, "On resume, start the epoch from its first batch.")

    # -- reproducibility -------------------------------------------------------------------------------
    seed: int = _arg(42, "Random seed set at the start of training.")
    data_seed: int | None = _arg(None, "Seed of the data samplers (default: seed).")
    full_determinism: bool = _arg(False, "Make torch deterministic (slower).")

    # -- data loading ------------------------------------------------------------------------------------
    dataloader_drop_last: bool = _arg(False, "Drop the last incomplete batch.")
    dataloader_num_workers: int = _arg(0, "DataLoader worker processes (0: load in the main process).")
    dataloader_prefetch_factor: int | None = _arg(None, "Batches prefetched per worker (needs workers).")
    dataloader_pin_memory: bool = _arg(True, "Pin host memory of batches.")
    dataloader_persistent_workers: bool = _arg(False, "Keep workers alive between epochs.")
    dataloader_multiprocessing_context: str | None = _arg(None, "Worker start method.", choices=_MP_CONTEXTS)
    dataloader_in_order: bool = _arg(True, "Return batches in sampler order.")
    dataloader_timeout: float = _arg(
        0, "trainwright: seconds to wait for a batch from the workers, then fail (0: forever; needs workers)."
    )
    remove_unused_columns: bool = _arg(True, "Drop dataset columns the model's forward does not take.")
    train_sampling_strategy: str = _arg("random", "Training sampler.", choices=_SAMPLING_STRATEGIES)
    group_by_length: bool = _arg(False, 'v4: same as train_sampling_strategy="group_by_length".')
    length_column_name: str = _arg("length", "Column with precomputed lengths for length grouping.")

    # -- devices and distributed --------------------------------------------------------------------
    use_cpu: bool = _arg(False, "Run on the CPU even if an accelerator is available.")
    local_rank: int = _arg(-1, "Local rank passed by old launchers (torchrun uses LOCAL_RANK).")
    ddp_backend: str | None = _arg(
        None, "Process-group backend (default: nccl on CUDA, gloo on CPU).", choices=_DDP_BACKENDS
    )
    ddp_timeout: int = _arg(1800, "Process-group timeout in seconds.")
    ddp_find_unused_parameters: bool | None = _arg(None, "DDP find_unused_parameters.")
    ddp_bucket_cap_mb: int | None = _arg(None, "DDP bucket_cap_mb.")
    ddp_broadcast_buffers: bool | None = _arg(None, "DDP broadcast_buffers.")
    ddp_static_graph: bool | None = _arg(None, "DDP static_graph.")
    fsdp: list[str] | str | None = _arg(None, 'FSDP options, e.g. "full_shard auto_wrap".')
    fsdp_config: dict[str, Any] | str | None = _arg(None, "FSDP settings (dict, JSON string or JSON file).")
    deepspeed: dict[str, Any] | str | None = _arg(None, "DeepSpeed config (dict, JSON string or file path).")
    accelerator_config: dict[str, Any] | str | None = _arg(None, "Accelerator settings (dict, JSON or file).")
    parallelism_config: Any | None = _arg(None, "v5 accelerate ParallelismConfig (not supported).")
    debug: list[str] | str = _arg("", "Debug options: underflow_overflow, tpu_metrics_debug.")

    # -- Hub (hub.py: huggingface_hub's create_repo / upload_folder) -----------------------------
    push_to_hub: bool = _arg(False, "Push output_dir to the Hub at saves (per hub_strategy) and save_model.")
    hub_model_id: str | None = _arg(None, "Hub repository id (default: the name of output_dir).")
    hub_strategy: HubStrategy | str = _arg(
        "every_save", "What to push when: end, every_save, checkpoint (+ last-checkpoint/), all_checkpoints."
    )
    hub_token: str | None = _arg(None, "Hub token (default: the logged-in one; redacted in to_dict).")
    hub_private_repo: bool | None = _arg(None, "Create the repository private (None: the owner's default).")
    hub_always_push: bool = _arg(False, "Push at a save even if the previous push is unfinished.")
    hub_revision: str | None = _arg(None, "Branch, tag or commit to push to.")

    # -- old (v4) names: mapped onto the fields above, or accepted without effect ---------------
    evaluation_strategy: IntervalStrategy | str | None = _arg(None, "Old name of eval_strategy.")
    per_gpu_train_batch_size: int | None = _arg(None, "Old name of per_device_train_batch_size.")
    per_gpu_eval_batch_size: int | None = _arg(None, "Old name of per_device_eval_batch_size.")
    no_cuda: bool = _arg(False, "Old name of use_cpu.")
    use_mps_device: bool = _arg(False, "Old flag; MPS is picked automatically.")
    adafactor: bool = _arg(False, 'Old flag for optim="adafactor".')
    fp16_backend: str = _arg("auto", "Old name of half_precision_backend.")
    fp16_opt_level: str = _arg("O1", "Apex optimisation level (only the default is accepted).")
    jit_mode_eval: bool = _arg(False, "torch.jit tracing for evaluation (only False is accepted).")
    use_legacy_prediction_loop: bool = _arg(False, "Legacy prediction loop (only False is accepted).")
    tpu_num_cores: int | None = _arg(None, "TPU cores (only None is accepted).")
    tpu_metrics_debug: bool = _arg(False, 'Old flag for debug="tpu_metrics_debug".')
    mp_parameters: str = _arg("", "SageMaker model-parallel parameters (only empty is accepted).")
    include_inputs_for_metrics: bool = _arg(False, 'Old flag for include_for_metrics=["inputs"].')
    torchdynamo: str | None = _arg(None, "Old name of torch_compile_backend.")
    push_to_hub_model_id: str | None = _arg(None, "Old name of hub_model_id.")
    push_to_hub_organization: str | None = _arg(None, "Old: organization prefixed to hub_model_id.")
    push_to_hub_token: str | None = _arg(None, "Old name of hub_token.")
    fsdp_min_num_params: int = _arg(0, 'Old: fsdp_config["min_num_params"].')
    fsdp_transformer_layer_cls_to_wrap: str | None = _arg(
        None, 'Old: fsdp_config["transformer_layer_cls_to_wrap"].'
    )
    ray_scope: str | None = _arg("last", "Ray Tune scope (refused: hyperparameter search uses optuna).")
    sharded_ddp: list[str] | str | None = _arg(
        "", "FairScale sharded DDP (transformers < 4.35): refused, use fsdp."
    )

    # ------------------------------------------------------------------------------ validation

    def __post_init__(self) -> None:
        self._resolve_paths()
        self._parse_dict_fields()
        self._resolve_old_names()
        self._resolve_choices()
        self._check_batches_and_length()
        self._resolve_intervals()
        self._resolve_best_model()
        self._check_optimization()
        self._resolve_precision_and_compile()
        self._check_distributed()
        self._resolve_reporting_and_io()

    def _invalid(self, name: str, expected: str, value: Any = dataclasses.MISSING) -> ValueError:
        shown = getattr(self, name) if value is dataclasses.MISSING else value
        return ValueError(f"{type(self).__name__}: {name}={shown!r} is invalid: {expected}")

    def _choice(self, name: str, enum_cls: type[Enum], value: Any = dataclasses.MISSING) -> Any:
        value = getattr(self, name) if value is dataclasses.MISSING else value
        try:
            return enum_cls(value)
        except ValueError:
            raise self._invalid(name, f"choose one of {[m.value for m in enum_cls]}", value) from None

    def _check_int(self, name: str, minimum: int, optional: bool = False) -> None:
        value = getattr(self, name)
        if optional and value is None:
            return
        if not _is_int(value) or value < minimum:
            raise self._invalid(name, f"expected {'None or ' if optional else ''}an integer >= {minimum}")

    def _one_of(self, name: str, allowed: list[str], optional: bool = False) -> None:
        value = getattr(self, name)
        if optional and value is None:
            return
        if value not in allowed:
            raise self._invalid(name, f"choose one of {allowed}")

    # -- paths and dict-valued fields --------------------------------------------------------------

    def _resolve_paths(self) -> None:
        if self.output_dir is None:
            self.output_dir = "trainer_output"
        # Expanding ~ here keeps os.makedirs from creating a literal "~" folder; nothing is created.
        self.output_dir = os.path.expanduser(os.fspath(self.output_dir))
        if self.logging_dir is not None:
            self.logging_dir = os.path.expanduser(os.fspath(self.logging_dir))
        if isinstance(self.resume_from_checkpoint, os.PathLike):
            self.resume_from_checkpoint = os.fspath(self.resume_from_checkpoint)

    def _parse_dict_fields(self) -> None:
        for name in _DICT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            if isinstance(value, str):
                value = self._dict_from_string(name, value)
            elif isinstance(value, Mapping):
                value = copy.deepcopy(dict(value))  # never mutate the caller's dict
            elif hasattr(value, "to_dict") and callable(value.to_dict):
                value = dict(value.to_dict())  # e.g. transformers' AcceleratorConfig
            elif value is not None:
                raise self._invalid(name, "expected a dict or a JSON object string")
            setattr(self, name, value)
        if self.lr_scheduler_kwargs is None:
            self.lr_scheduler_kwargs = {}
        if self.fsdp_config is None:
            self.fsdp_config = {}
        self.fsdp_config = {
            (k[5:] if k.startswith("fsdp_") else k): v
            for k, v in cast(dict[str, Any], self.fsdp_config).items()  # a dict since _parse_dict_fields
        }
        # An AcceleratorConfig (accelerator_config.py): read by attribute or as a dict; refused
        # settings raise here, gradient_accumulation_kwargs["num_steps"] sets the accumulation.
        # (the field is annotated with what the constructor and the command line take; from here on
        # it holds the AcceleratorConfig, which its annotation cannot say)
        accelerator_config = AcceleratorConfig.from_mapping(
            cast(Mapping[str, Any], self.accelerator_config or {}), type(self).__name__
        )
        self.accelerator_config = cast(Any, accelerator_config)
        steps = (accelerator_config.gradient_accumulation_kwargs or {}).get("num_steps")
        if steps is not None and steps != self.gradient_accumulation_steps:
            if self.gradient_accumulation_steps != 1:
                raise self._invalid(
                    "gradient_accumulation_steps",
                    f"accelerator_config's gradient_accumulation_kwargs num_steps={steps} also sets it; give one",
                )
            self.gradient_accumulation_steps = steps

    def _dict_from_string(self, name: str, text: str) -> dict[str, Any] | str:
        if text.strip().startswith("{"):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as e:
                raise self._invalid(name, f"not valid JSON ({e.msg} at position {e.pos})") from None
            if not isinstance(parsed, dict):
                raise self._invalid(name, "expected a JSON object")
            return parsed
        if name not in _DICT_FILE_FIELDS:
            raise self._invalid(name, "expected a dict or a JSON object string starting with '{'")
        path = os.path.expanduser(text)
        if not os.path.isfile(path):
            raise self._invalid(
                name, f"expected a dict, a JSON object string or an existing JSON file; {path} not found"
            )
        if name == "deepspeed":
            return path  # DeepSpeed reads its own config file
        try:
            with open(path, encoding="utf-8") as f:
                parsed = json.load(f)
        except json.JSONDecodeError as e:
            raise self._invalid(name, f"{path} is not valid JSON ({e.msg})") from None
        if not isinstance(parsed, dict):
            raise self._invalid(name, f"{path} must hold a JSON object")
        return parsed

    # -- old names -----------------------------------------------------------------------------------

    def _take_old(self, old: str, v4_default: Any, new: str | None) -> Any:
        """Return the value given under the old name `old` (None if unset or the v4 default). The old
        field keeps it, so v4 code reads back what it set (`args.no_cuda` stays True)."""
        value = getattr(self, old)
        if value is None or value == v4_default:
            return None
        target = f"; use {new} instead" if new else ""
        _warn_once(old, f"{old} is an old (transformers v4) argument name{target}.")
        return value

    def _merge_old(self, old: str, new: str, value: Any, new_default: Any) -> None:
        """Put the old name's value into `new`, unless `new` was also set to something else."""
        current = getattr(self, new)
        if current is None or current == new_default:
            setattr(self, new, value)
        elif current != value:
            raise ValueError(
                f"{type(self).__name__}: {old}={value!r} (old name) and {new}={current!r} disagree; give only {new}"
            )

    def _resolve_old_names(self) -> None:
        if (v := self._take_old("evaluation_strategy", "no", "eval_strategy")) is not None:
            self._merge_old(
                "evaluation_strategy",
                "eval_strategy",
                self._choice("evaluation_strategy", IntervalStrategy, v),
                "no",
            )
        for kind in ("train", "eval"):
            old, new = f"per_gpu_{kind}_batch_size", f"per_device_{kind}_batch_size"
            if (v := self._take_old(old, None, new)) is not None:
                self._merge_old(old, new, v, 8)
        if self._take_old("no_cuda", False, "use_cpu"):
            self.use_cpu = True
        if self._take_old("adafactor", False, 'optim="adafactor"'):
            self._merge_old("adafactor", "optim", "adafactor", "adamw_torch_fused")
        if (v := self._take_old("fp16_backend", "auto", "half_precision_backend")) is not None:
            self._merge_old("fp16_backend", "half_precision_backend", v, "auto")
        if (v := self._take_old("torchdynamo", None, "torch_compile_backend")) is not None:
            self._merge_old("torchdynamo", "torch_compile_backend", v, None)
        if self._take_old("group_by_length", False, 'train_sampling_strategy="group_by_length"'):
            self._merge_old("group_by_length", "train_sampling_strategy", "group_by_length", "random")
        if self._take_old("include_inputs_for_metrics", False, 'include_for_metrics=["inputs"]'):
            self.include_for_metrics = [*(self.include_for_metrics or []), "inputs"]
        if self._take_old("tpu_metrics_debug", False, 'debug="tpu_metrics_debug"'):
            self.debug = list(dict.fromkeys([*_words(self.debug), "tpu_metrics_debug"]))
        self._resolve_old_hub_names()
        if (v := self._take_old("fsdp_min_num_params", 0, 'fsdp_config["min_num_params"]')) is not None:
            cast(dict[str, Any], self.fsdp_config).setdefault("min_num_params", v)  # a dict by now
        if (v := self._take_old("fsdp_transformer_layer_cls_to_wrap", None, "fsdp_config")) is not None:
            cast(dict[str, Any], self.fsdp_config).setdefault("transformer_layer_cls_to_wrap", v)
        for name, (v4_default, why) in _NO_EFFECT.items():
            if getattr(self, name) == v4_default:
                continue
            if name == "use_mps_device" and _mps_available():
                _warn_once(name, f"use_mps_device is not needed: {why}.")
                continue
            raise self._invalid(name, f"trainwright cannot honour it: {why}; leave it at {v4_default!r}")
        if not self.save_safetensors:
            raise self._invalid(
                "save_safetensors",
                "trainwright always writes safetensors (pickled weights would break its nothing-pickled rule)",
            )
            self.save_safetensors = True
        self._sync_checkpointing_names()

    def _resolve_old_hub_names(self) -> None:
        if (v := self._take_old("push_to_hub_token", None, "hub_token")) is not None:
            self._merge_old("push_to_hub_token", "hub_token", v, None)
        model_id = self._take_old("push_to_hub_model_id", None, "hub_model_id")
        organization = self._take_old("push_to_hub_organization", None, "hub_model_id")
        if organization is not None:
            assert self.output_dir is not None  # _resolve_paths ran first
            model_id = f"{organization}/{model_id or os.path.basename(self.output_dir.rstrip('/'))}"
        if model_id is not None:
            self._merge_old("push_to_hub_model_id", "hub_model_id", model_id, None)

    def _sync_checkpointing_names(self) -> None:
        # The v5 name wins when given; the v4 name then mirrors it so code reading either agrees.
        for old, new in (
            ("gradient_checkpointing", "activation_checkpointing"),
            ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
        ):
            if getattr(self, new) is None:
                value = getattr(self, old)
                if value:
                    _warn_once(old, f"{old} is the v4 name of {new}; use {new} instead.")
                setattr(self, new, value)
            setattr(self, old, getattr(self, new))
        self.activation_checkpointing = self.gradient_checkpointing = bool(self.activation_checkpointing)

    # -- choice-valued fields --------------------------------------------------------------------

    def _resolve_choices(self) -> None:
        self.eval_strategy = self._choice("eval_strategy", IntervalStrategy)
        self.logging_strategy = self._choice("logging_strategy", IntervalStrategy)
        self.save_strategy = self._choice("save_strategy", SaveStrategy)
        self.hub_strategy = self._choice("hub_strategy", HubStrategy)
        if self.lr_scheduler_type == "greedy":
            raise self._invalid(
                "lr_scheduler_type",
                f"the greedy schedule is not provided; choose one of {SchedulerType.values()}",
            )
        self.lr_scheduler_type = self._choice("lr_scheduler_type", SchedulerType)
        if isinstance(self.optim, Enum):  # ours or transformers' OptimizerNames: str() is not the value
            self.optim = self.optim.value
        if self.optim == OptimizerNames.ADAMW_HF:
            _warn_once("adamw_hf", 'optim="adamw_hf" is the old name of "adamw_torch"; using "adamw_torch".')
            self.optim = "adamw_torch"
        if str(self.optim) not in OptimizerNames.values():
            allowed = [v for v in OptimizerNames.values() if v != "adamw_hf"]
            raise self._invalid("optim", f"not an optimizer trainwright provides; choose one of {allowed}")
        self.optim = OptimizerNames(self.optim)
        self.debug = [self._choice("debug", DebugOption, w) for w in _words(self.debug)]
        self._resolve_fsdp()
        if isinstance(self.include_num_input_tokens_seen, bool):
            self.include_num_input_tokens_seen = "all" if self.include_num_input_tokens_seen else "no"
        self._one_of("include_num_input_tokens_seen", _TOKENS_SEEN)
        self._one_of("train_sampling_strategy", _SAMPLING_STRATEGIES)
        self.group_by_length = self.train_sampling_strategy == "group_by_length"  # the v4 name reads it back
        if isinstance(self.include_for_metrics, str):
            self.include_for_metrics = [self.include_for_metrics]
        self.include_for_metrics = list(dict.fromkeys(self.include_for_metrics or []))
        bad = [m for m in self.include_for_metrics if m not in _METRIC_INPUTS]
        if bad:
            raise self._invalid("include_for_metrics", f"unknown entries {bad}; allowed: {_METRIC_INPUTS}")
        if isinstance(self.label_names, str):
            self.label_names = [self.label_names]
        self._one_of("log_level", list(_LOG_LEVELS))
        self._one_of("log_level_replica", list(_LOG_LEVELS))
        self._one_of("half_precision_backend", _HALF_PRECISION_BACKENDS)
        if self.half_precision_backend == "apex":
            raise self._invalid(
                "half_precision_backend",
                "apex is not used: mixed precision is torch.amp ('auto' or 'cpu_amp')",
            )
        self._one_of("ddp_backend", _DDP_BACKENDS, optional=True)
        self._one_of("dataloader_multiprocessing_context", _MP_CONTEXTS, optional=True)

    def _resolve_fsdp(self) -> None:
        value = self.fsdp
        words = [FSDPOption.FULL_SHARD] if value is True else [] if value is False else _words(value)
        options = list(dict.fromkeys(self._choice("fsdp", FSDPOption, w) for w in words))
        strategies = [o.value for o in options if o in FSDP_SHARDING_STRATEGIES]
        if len(strategies) > 1:
            raise self._invalid("fsdp", f"names several sharding strategies {strategies}; give one")
        if options and not strategies:
            options.insert(0, FSDPOption.FULL_SHARD)  # offload/auto_wrap alone mean full sharding
        self.fsdp = options
        fsdp_config = cast(dict[str, Any], self.fsdp_config)  # a dict since _parse_dict_fields
        wrap = fsdp_config.get("transformer_layer_cls_to_wrap")
        if isinstance(wrap, str):
            fsdp_config["transformer_layer_cls_to_wrap"] = [wrap]

    # -- batches, length of training, seeds --------------------------------------------------------

    def _check_batches_and_length(self) -> None:
        for name in (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
        ):
            self._check_int(name, 1)
        self._check_int("eval_accumulation_steps", 1, optional=True)
        self._check_int("dataloader_num_workers", 0)
        if self.dataloader_prefetch_factor is not None and self.dataloader_num_workers == 0:
            raise self._invalid("dataloader_prefetch_factor", "only valid with dataloader_num_workers > 0")
        self._check_int("dataloader_prefetch_factor", 1, optional=True)
        if not _is_finite(self.dataloader_timeout) or self.dataloader_timeout < 0:
            raise self._invalid("dataloader_timeout", "expected a number of seconds >= 0 (0: wait forever)")
        if self.dataloader_timeout > 0 and self.dataloader_num_workers == 0:
            raise self._invalid("dataloader_timeout", "only applies with dataloader_num_workers > 0")
        if self.dataloader_multiprocessing_context is not None and self.dataloader_num_workers == 0:
            raise self._invalid(
                "dataloader_multiprocessing_context", "only applies with dataloader_num_workers > 0"
            )
        if self.dataloader_in_order is False and self.dataloader_num_workers > 0:
            logger.warning(
                "dataloader_in_order=False: workers return batches as they finish, so a checkpoint's "
                "position may not match the batches seen so far; a resume can repeat or skip those few batches."
            )
        if _is_number(self.max_steps) and float(self.max_steps).is_integer():
            self.max_steps = int(self.max_steps)
        if not _is_int(self.max_steps):
            raise self._invalid("max_steps", "expected an integer (-1: use num_train_epochs)")
        if not _is_finite(self.num_train_epochs) or (self.max_steps <= 0 and self.num_train_epochs <= 0):
            raise self._invalid("num_train_epochs", "expected a finite number > 0 (or max_steps > 0)")
        self._check_int("torch_empty_cache_steps", 1, optional=True)
        self._check_int("past_index", -1)
        alpha = self.neftune_noise_alpha
        if alpha is not None and (not _is_number(alpha) or alpha <= 0):
            raise self._invalid(
                "neftune_noise_alpha", "expected None or a number > 0 (the paper used 5 to 15)"
            )
        if self.liger_kernel_config and not self.use_liger_kernel:
            raise self._invalid(
                "liger_kernel_config", "it is only used with use_liger_kernel=True: set that too"
            )
        self._check_int("save_total_limit", 1, optional=True)
        self._check_int("ddp_timeout", 1)
        for name in ("seed", "data_seed"):
            value = getattr(self, name)
            if (value is not None or name == "seed") and (not _is_int(value) or not 0 <= value < 2**32):
                raise self._invalid(name, "expected an integer in [0, 2**32)")

    # -- logging / evaluation / save intervals ---------------------------------------------------

    def _resolve_intervals(self) -> None:
        if self.eval_strategy != IntervalStrategy.NO:
            self.do_eval = True
        if self.eval_strategy == IntervalStrategy.STEPS and not self.eval_steps:
            if not self.logging_steps or self.logging_steps <= 0:
                raise self._invalid(
                    "eval_steps",
                    "eval_strategy='steps' needs eval_steps > 0 (or logging_steps > 0 to fall back on)",
                )
            self.eval_steps = self.logging_steps
        self._check_interval(
            "logging_steps", self.logging_strategy == IntervalStrategy.STEPS, "logging_strategy"
        )
        self._check_interval("eval_steps", self.eval_strategy == IntervalStrategy.STEPS, "eval_strategy")
        self._check_interval("save_steps", self.save_strategy == SaveStrategy.STEPS, "save_strategy")
        if not _is_number(self.eval_delay) or self.eval_delay < 0:
            raise self._invalid("eval_delay", "expected a number >= 0")

    def _check_interval(self, name: str, used: bool, strategy: str) -> None:
        value = getattr(self, name)
        if value is None:
            return
        if not _is_finite(value):
            raise self._invalid(
                name, "expected a finite number: an integer step count, or a fraction < 1 of the run"
            )
        if used and value <= 0:
            raise self._invalid(name, f"{strategy}='steps' needs {name} > 0 (or set {strategy}='no')")
        if value > 1 and not float(value).is_integer():
            raise self._invalid(
                name, "a value above 1 must be a whole number of steps (below 1 it is a fraction)"
            )
        if value >= 1:
            setattr(self, name, int(value))

    # -- best model ------------------------------------------------------------------------------------

    def _resolve_best_model(self) -> None:
        plateau = self.lr_scheduler_type == SchedulerType.REDUCE_ON_PLATEAU
        if (self.load_best_model_at_end or plateau) and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        if self.save_strategy == SaveStrategy.BEST and self.metric_for_best_model is None:
            raise self._invalid("save_strategy", "'best' needs metric_for_best_model (the metric to compare)")
        if plateau and self.eval_strategy == IntervalStrategy.NO:
            raise self._invalid(
                "lr_scheduler_type", "reduce_lr_on_plateau needs an eval_strategy other than 'no'"
            )
        if self.load_best_model_at_end and self.save_strategy != SaveStrategy.BEST:
            self._check_best_model_schedule()

    def _check_best_model_schedule(self) -> None:
        if self.eval_strategy != self.save_strategy:
            raise ValueError(
                f"{type(self).__name__}: load_best_model_at_end needs eval_strategy and save_strategy to match "
                f"(or save_strategy='best'); got eval_strategy={cast(Enum, self.eval_strategy).value!r}, "
                f"save_strategy={cast(Enum, self.save_strategy).value!r}"
            )
        if self.eval_strategy != IntervalStrategy.STEPS:
            return
        save, every = self.save_steps, self.eval_steps
        assert every is not None  # _resolve_intervals set it (to logging_steps when None)
        if (save < 1) != (every < 1):
            raise ValueError(
                f"{type(self).__name__}: load_best_model_at_end needs save_steps to be a multiple of eval_steps, "
                f"which cannot be guaranteed when one is a fraction: save_steps={save}, eval_steps={every}"
            )
        # Fractions are compared in millionths so that 0.2 vs 0.1 does not fail on float rounding.
        scale = 1 if save >= 1 else 1_000_000
        if round(save * scale) % round(every * scale) != 0:
            raise ValueError(
                f"{type(self).__name__}: load_best_model_at_end needs save_steps to be a multiple of eval_steps; "
                f"got save_steps={save}, eval_steps={every}"
            )

    # -- optimization ----------------------------------------------------------------------------------

    def _check_optimization(self) -> None:
        if not _is_finite(self.learning_rate) or self.learning_rate < 0:
            raise self._invalid("learning_rate", "expected a finite number >= 0")
        if not _is_finite(self.weight_decay):
            raise self._invalid("weight_decay", "expected a finite number")
        if self.max_grad_norm is not None and (not _is_finite(self.max_grad_norm) or self.max_grad_norm < 0):
            raise self._invalid("max_grad_norm", "expected a finite number >= 0 (0 or None: no clipping)")
        for beta in ("adam_beta1", "adam_beta2"):
            if not _is_finite(getattr(self, beta)) or not 0 <= getattr(self, beta) < 1:
                raise self._invalid(beta, "expected a number in [0, 1)")
        if not _is_finite(self.adam_epsilon) or self.adam_epsilon < 0:
            raise self._invalid("adam_epsilon", "expected a finite number >= 0")
        if not _is_finite(self.warmup_steps) or self.warmup_steps < 0:
            raise self._invalid("warmup_steps", "expected >= 0: a step count, or a fraction < 1 of the run")
        if self.warmup_steps >= 1:
            if not float(self.warmup_steps).is_integer():
                raise self._invalid("warmup_steps", "a value of 1 or more must be a whole number of steps")
            self.warmup_steps = int(self.warmup_steps)
        elif self.warmup_steps == 0:
            self.warmup_steps = 0
        if not _is_number(self.warmup_ratio) or not 0 <= self.warmup_ratio <= 1:
            raise self._invalid("warmup_ratio", "expected a fraction in [0, 1]")
        if self.warmup_ratio > 0:
            _warn_once(
                "warmup_ratio", "warmup_ratio is the v4 name; v5 takes a fraction in warmup_steps (e.g. 0.1)."
            )
            if isinstance(self.warmup_steps, float):
                raise ValueError(
                    f"{type(self).__name__}: warmup_ratio={self.warmup_ratio} and the fraction "
                    f"warmup_steps={self.warmup_steps} both set the warmup; give only warmup_steps"
                )
            if self.warmup_steps > 0:
                logger.warning(
                    "warmup_steps=%s overrides warmup_ratio=%s", self.warmup_steps, self.warmup_ratio
                )
        if not _is_number(self.label_smoothing_factor) or not 0 <= self.label_smoothing_factor < 1:
            raise self._invalid("label_smoothing_factor", "expected a number in [0, 1)")

    # -- precision and compilation -------------------------------------------------------------------

    def _resolve_precision_and_compile(self) -> None:
        if self.fp16 and self.bf16:
            raise ValueError(
                f"{type(self).__name__}: fp16=True and bf16=True; at most one of fp16 and bf16 may be set"
            )
        if self.fp16_full_eval and self.bf16_full_eval:
            raise ValueError(
                f"{type(self).__name__}: fp16_full_eval=True and bf16_full_eval=True; at most one may be set"
            )
        if self.torch_compile_backend is not None or self.torch_compile_mode is not None:
            self.torch_compile = True
        if self.torch_compile and self.torch_compile_backend is None:
            self.torch_compile_backend = "inductor"

    # -- distributed -----------------------------------------------------------------------------------

    def _check_distributed(self) -> None:
        if self.fsdp and self.deepspeed:
            raise ValueError(f"{type(self).__name__}: fsdp and deepspeed are both set; choose one of them")
        if self.auto_find_batch_size and (self.fsdp or self.deepspeed):
            raise self._invalid(
                "auto_find_batch_size",
                "not supported with fsdp or deepspeed: a retry after an out-of-memory error would shard or "
                "re-initialise a model the failed try already sharded. Set per_device_train_batch_size instead",
            )
        if self.parallelism_config is not None:
            raise self._invalid(
                "parallelism_config",
                "accelerate's ParallelismConfig is not supported; use fsdp / fsdp_config",
            )
        if self.sharded_ddp:
            raise self._invalid(
                "sharded_ddp",
                "FairScale's sharded DDP (transformers < 4.35) is not provided; use fsdp "
                '(e.g. fsdp="full_shard" for zero_dp_3, fsdp="shard_grad_op" for zero_dp_2)',
            )
        env_local_rank = os.environ.get("LOCAL_RANK")
        if self.local_rank != -1:
            self._check_int("local_rank", 0)
            if self.local_rank != (int(env_local_rank) if env_local_rank not in (None, "") else 0):
                raise self._invalid(
                    "local_rank",
                    f"this process's LOCAL_RANK is {env_local_rank!r} (what the runtime uses); launch with "
                    "torchrun, which sets LOCAL_RANK, and leave local_rank at -1",
                )
        if self.project != "huggingface":
            raise self._invalid(
                "project",
                "upstream only the trackio reporter reads it, and trainwright has no trackio reporter; "
                "name the project through the reporter's own setting (WANDB_PROJECT, COMET_PROJECT_NAME, ...)",
            )
        for name, accepted in (
            ("trackio_space_id", (None, "trackio")),  # "trackio": v4's default, in v4 training_args.json
            ("trackio_bucket_id", (None,)),
            ("trackio_static_space_id", (None, False)),
        ):
            if getattr(self, name) not in accepted:
                raise self._invalid(
                    name,
                    "only the trackio reporter reads it upstream, and trainwright has no trackio reporter",
                )
        if self.ray_scope not in ("last", None):
            raise self._invalid(
                "ray_scope",
                "only hyperparameter_search's Ray Tune backend reads it, and trainwright provides optuna only",
            )

    # -- reporting, output and signals -----------------------------------------------------------

    def _resolve_reporting_and_io(self) -> None:
        self.report_to = self._normalise_report_to(self.report_to)
        if self.disable_tqdm is None:
            self.disable_tqdm = logging.getLogger("trainwright").getEffectiveLevel() > logging.WARNING
        if self.use_cpu:
            self.dataloader_pin_memory = False
        elif cast(AcceleratorConfig, self.accelerator_config).non_blocking and not self.dataloader_pin_memory:
            logger.warning(
                "accelerator_config non_blocking=True but dataloader_pin_memory=False: copies from pageable "
                "memory are not asynchronous; enable both for the best performance."
            )
        try:
            parse_size(self.save_max_shard_size)  # the parser the checkpoint writer uses
        except ValueError as e:
            raise self._invalid("save_max_shard_size", str(e)) from None
        if self.preemption_signals is None:  # not given: an explicit enable_jit_checkpoint=False turns it off
            off = self.enable_jit_checkpoint is False
            self.preemption_signals = [] if off else list(_DEFAULT_PREEMPTION_SIGNALS)
        self.preemption_signals = self._normalise_signals(self.preemption_signals)

    @staticmethod
    def _normalise_report_to(value: Any) -> list[str]:
        if value is None:
            return []
        names = value.split(",") if isinstance(value, str) else list(value)
        names = [str(n).strip() for n in names if str(n).strip()]
        return list(dict.fromkeys(n for n in names if n != "none"))

    def _normalise_signals(self, value: Any) -> list[str]:
        if value is None:
            return []
        items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
        names = []
        for item in items:
            if _is_int(item):
                try:
                    name = signal.Signals(int(item)).name
                except ValueError:
                    raise self._invalid("preemption_signals", f"{item} is not a signal number here") from None
            else:
                name = str(item).strip().upper()
                name = name if name.startswith("SIG") else "SIG" + name
            if name not in signal.Signals.__members__:
                raise self._invalid("preemption_signals", f"{item!r} is not a signal name on this platform")
            if name in ("SIGKILL", "SIGSTOP"):
                raise self._invalid("preemption_signals", f"{name} cannot be caught")
            names.append(name)
        return list(dict.fromkeys(names))

    # ---------------------------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready values: enums as strings, dtypes as names, tokens redacted."""
        out = {}
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name.endswith("_token") and value is not None:
                value = _redacted(f.name)
            out[f.name] = _jsonable(value)
        return out

    def to_json_string(self) -> str:
        """`to_dict()` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_json_file(self, path: str | os.PathLike[str]) -> None:
        """Write `to_json_string()` to `path` (e.g. `training_args.json`)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json_string())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainingArguments":
        """Rebuild arguments from `to_dict()` output; unknown keys are an error, redacted tokens become None."""
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{cls.__name__}.from_dict: unknown keys {unknown}")
        kwargs: dict[str, Any] = {
            k: (None if k.endswith("_token") and v == _redacted(k) else v) for k, v in data.items()
        }
        return cls(**kwargs)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> "TrainingArguments":
        """Read arguments written by `to_json_file` (or transformers' `to_json_string`)."""
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{os.fspath(path)}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{os.fspath(path)}: expected a JSON object of argument names to values")
        return cls.from_dict(data)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """`to_dict()` plus the batch sizes, with only int/float/str/bool/Tensor values (others as str)."""
        d = {
            **self.to_dict(),
            "train_batch_size": self.train_batch_size,
            "eval_batch_size": self.eval_batch_size,
        }
        plain = (bool, int, float, str)
        return {k: v if type(v) in plain or isinstance(v, torch.Tensor) else str(v) for k, v in d.items()}

    def __str__(self) -> str:
        body = "".join(f"  {k}={v!r},\n" for k, v in self.to_dict().items())
        return f"{type(self).__name__}(\n{body})"

    __repr__ = __str__

    # -------------------------------------------------------------------- derived quantities

    @property
    def train_batch_size(self) -> int:
        """Training batch size of one process (one device per process)."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        """Evaluation batch size of one process (one device per process)."""
        return self.per_device_eval_batch_size

    @property
    def ddp_timeout_delta(self) -> datetime.timedelta:
        """`ddp_timeout` as a timedelta."""
        return datetime.timedelta(seconds=self.ddp_timeout)

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup steps for a run of `num_training_steps` optimizer steps.

        An integer `warmup_steps` > 0 is used as is; otherwise the fraction is `warmup_steps` when it is a
        float below 1, else `warmup_ratio`, and the count is ceil(num_training_steps * fraction).
        """
        if not _is_int(num_training_steps) or num_training_steps < 0:
            raise ValueError(
                f"get_warmup_steps: num_training_steps must be an integer >= 0, got {num_training_steps!r}"
            )
        if isinstance(self.warmup_steps, float) and 0 < self.warmup_steps < 1:
            fraction = self.warmup_steps
        elif self.warmup_steps > 0:
            return int(self.warmup_steps)
        else:
            fraction = self.warmup_ratio
        return math.ceil(num_training_steps * fraction)

    def get_process_log_level(self) -> int:
        """Log level for this process: `log_level` where `should_log`, else `log_level_replica`.

        "passive" gives transformers' verbosity, as upstream does, when transformers is imported (an
        example script's `transformers.utils.logging.set_verbosity_info()` makes it INFO); without
        transformers, the current level of the `trainwright` logger.
        """
        name = self.log_level if self.should_log else self.log_level_replica
        level = _LOG_LEVELS[name]
        if level != -1:
            return level
        if "transformers" in sys.modules:
            import transformers.utils.logging as hf_logging

            return hf_logging.get_verbosity()
        return logging.getLogger("trainwright").getEffectiveLevel()

    # -------------------------------------------------------------- devices and processes (lazy)

    def _runtime(self) -> runtime_module.Runtime:
        return runtime_module.get_runtime(
            use_cpu=self.use_cpu, backend=self.ddp_backend, timeout_s=self.ddp_timeout
        )

    @property
    def device(self) -> torch.device:
        """The device of this process."""
        return self._runtime().device

    @property
    def n_gpu(self) -> int:
        """Accelerators used by this process: 0 on CPU, else 1 (there is no DataParallel)."""
        return 0 if self.device.type == "cpu" else 1

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return self._runtime().world_size

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        return self._runtime().rank

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node."""
        return self._runtime().local_rank

    @property
    def parallel_mode(self) -> ParallelMode:
        """DISTRIBUTED with several processes, else NOT_PARALLEL."""
        return ParallelMode.DISTRIBUTED if self.world_size > 1 else ParallelMode.NOT_PARALLEL

    @property
    def should_log(self) -> bool:
        """Whether this process logs: each node's main process with log_on_each_node, else rank 0."""
        rt = self._runtime()
        return rt.is_local_main_process if self.log_on_each_node else rt.is_main_process

    @property
    def should_save(self) -> bool:
        """Whether this process writes files: each node's main process with save_on_each_node, else rank 0."""
        rt = self._runtime()
        return rt.is_local_main_process if self.save_on_each_node else rt.is_main_process

    @property
    def place_model_on_device(self) -> bool:
        """Whether the Trainer moves the model to `device` (DeepSpeed places it itself)."""
        return not self.deepspeed

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        """Run the body on the (local) main process first, then on the others (e.g. dataset caching)."""
        rt = self._runtime()
        logger.debug("process %d: %s, main %s process first", rt.rank, desc, "local" if local else "global")
        with rt.main_process_first(local=local):
            yield


# Field defaults, used to reset old (v4) names once their value has been moved.
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}


@dataclass(repr=False)
class Seq2SeqTrainingArguments(TrainingArguments):
    """`TrainingArguments` plus the generation settings of `Seq2SeqTrainer`."""

    sortish_sampler: bool = _arg(False, "Refused: upstream ignores it; use train_sampling_strategy.")
    predict_with_generate: bool = _arg(
        False, "Use generate() in evaluate/predict to compute generative metrics."
    )
    generation_max_length: int | None = _arg(
        None, "max_length for generate() in evaluation (default: model's)."
    )
    generation_num_beams: int | None = _arg(
        None, "num_beams for generate() in evaluation (default: model's)."
    )
    generation_config: dict[str, Any] | str | None = _arg(
        None, "Generation config: a dict, a folder/file path, or a GenerationConfig."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sortish_sampler:
            raise self._invalid(
                "sortish_sampler",
                "upstream's Seq2SeqTrainer does not read it either (it belonged to the old Seq2SeqDataset "
                'examples); for batches of similar lengths use train_sampling_strategy="group_by_length"',
            )
        self._check_int("generation_max_length", 1, optional=True)
        self._check_int("generation_num_beams", 1, optional=True)
        if isinstance(self.generation_config, os.PathLike):
            self.generation_config = os.fspath(self.generation_config)
        if isinstance(self.generation_config, str) and self.generation_config.strip().startswith("{"):
            self.generation_config = self._dict_from_string("generation_config", self.generation_config)

"""`TrainingArguments` and `Seq2SeqTrainingArguments`: the settings of a run, validated when built.

This file declares the fields (with their one-line help); what happens to them lives beside it:
`validation.py` (the steps of `__post_init__`), `aliases.py` (the v4/v5 differences,
`V4_V5_CHOICES`, and old v4 names), `checks.py` (allowed values), `serialization.py` (`to_dict`
and back) and `properties.py` (derived values and the process facts).

Every argument name of transformers' v4 (4.57) and v5 (5.23) `TrainingArguments` is accepted.
Old (v4) names that were renamed upstream warn once (`FutureWarning`) when given a value other than
their v4 default, and are mapped onto the new field; after construction the old field holds its
v4 default again, so `to_dict()` and a rebuild from it stay consistent. Where v4 and v5 disagree,
`V4_V5_CHOICES` says which behaviour trainwright follows.

Construction touches no device and no process group: `device`, `world_size`, `should_save` and
friends ask the runtime (`trainwright.core.runtime.get_runtime`) the first time they are read.
"""

import contextlib
import dataclasses
import datetime
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import torch

from trainwright.args import process_state, properties, serialization, validation
from trainwright.args.aliases import V4_V5_CHOICES, takes_removed_v4_args
from trainwright.args.checks import (
    DDP_BACKENDS,
    DICT_FIELDS,
    HALF_PRECISION_BACKENDS,
    LOG_LEVELS,
    MP_CONTEXTS,
    SAMPLING_STRATEGIES,
)
from trainwright.core.enums import (
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


def _arg(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, **meta: Any) -> Any:
    """A dataclass field whose metadata carries its one-line help (and argparse choices)."""
    metadata = {"help": help, **meta}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# ------------------------------------------------------------------------------- the dataclass


@takes_removed_v4_args  # save_safetensors=True, as a v4 script passes it
@dataclass(repr=False)
class TrainingArguments:
    """Everything that configures a `Trainer` run; validated in `__post_init__`.

    Field help is in each field's metadata (the command-line parser shows it). Choice-valued
    fields become `str` enums that compare equal to their string values.
    """

    # upstream's class attribute: the fields a command line may give as a JSON object string. A
    # subclass (TRL's configs) extends it with its own; those are parsed as upstream parses them.
    _VALID_DICT_FIELDS = list(DICT_FIELDS)

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
    lr_scheduler_kwargs: dict | str | None = _arg(
        None, "Extra schedule arguments (dict or JSON string).", factory=dict
    )
    warmup_steps: float = _arg(0, "Warmup steps (int), or a fraction of the training steps (float < 1).")
    warmup_ratio: float | None = _arg(
        0.0, "v4: warmup as a fraction of the training steps (used if warmup_steps is 0; None: unset)."
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
        choices=HALF_PRECISION_BACKENDS,
    )
    tf32: bool | None = _arg(None, "Allow TF32 matmuls on Ampere+ GPUs (None leaves torch's setting).")
    activation_checkpointing: bool | None = _arg(
        None, "Recompute activations in backward to save memory (v5)."
    )
    activation_checkpointing_kwargs: dict[str, Any] | str | None = _arg(
        None, "Arguments of activation checkpointing (dict or JSON string)."
    )
    gradient_checkpointing: bool | None = _arg(None, "v4 name of activation_checkpointing.")
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
    fused_linear_cross_entropy: bool = _arg(
        False,
        "trainwright: compute a language model's loss from its last hidden states and output embedding "
        "in chunks, never holding the batch x sequence x vocabulary logits (forward and backward). "
        "Decided per model: where its logits are not its head's output, it keeps its own loss (logged).",
    )
    lean_activations: bool = _arg(
        False,
        "trainwright: for the training, compute the model's Python GELU modules as one op and its SDPA "
        "attention under dropout on the CPU without keeping the probabilities: the same functions, less "
        "kept for the backward (the model's own modules are back after train()).",
    )
    use_cache: bool = _arg(False, "Value written to model.config.use_cache during training.")

    # -- logging -------------------------------------------------------------------------------------
    logging_strategy: IntervalStrategy | str = _arg("steps", "When to log: no, steps or epoch.")
    logging_steps: float = _arg(500, "Log every N steps (int), or every fraction of the run (float < 1).")
    logging_first_step: bool = _arg(False, "Also log after the first optimizer step.")
    logging_nan_inf_filter: bool = _arg(True, "Leave NaN/inf losses out of the logged average.")
    logging_dir: str | None = _arg(None, "v4: TensorBoard log folder (None: output_dir/runs/<time>_<host>).")
    log_on_each_node: bool = _arg(True, "Log from the main process of every node, not only the first.")
    log_level: str = _arg("passive", "Log level on the main process.", choices=list(LOG_LEVELS))
    log_level_replica: str = _arg("warning", "Log level on the other processes.", choices=list(LOG_LEVELS))
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
    trackio_static_space_id: Union[str, None, Literal[False]] = _arg(
        None, "Trackio static Space id (refused)."
    )  # noqa: UP007

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
    save_on_each_node: bool = _arg(False, "Write checkpoints on every node (no shared filesystem).")
    save_only_model: bool = _arg(False, "Save only the model (no optimizer/scheduler/RNG: no resume).")
    save_max_shard_size: str = _arg("5GB", "Largest safetensors shard, e.g. '5GB', '500MiB'.")
    async_save: bool = _arg(
        False,
        "trainwright: write checkpoints in the background. At a save step the checkpoint's tensors are "
        "copied into reused host memory (one checkpoint's worth) and training goes on while a thread "
        "writes the same files; on_save fires once the checkpoint is durable.",
    )
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
    dataloader_multiprocessing_context: str | None = _arg(None, "Worker start method.", choices=MP_CONTEXTS)
    dataloader_in_order: bool = _arg(True, "Return batches in sampler order.")
    dataloader_timeout: float = _arg(
        0, "trainwright: seconds to wait for a batch from the workers, then fail (0: forever; needs workers)."
    )
    remove_unused_columns: bool = _arg(True, "Drop dataset columns the model's forward does not take.")
    train_sampling_strategy: str = _arg("random", "Training sampler.", choices=SAMPLING_STRATEGIES)
    group_by_length: bool = _arg(False, 'v4: same as train_sampling_strategy="group_by_length".')
    padding_free: bool = _arg(
        False,
        "trainwright: flatten each batch's samples into one row without padding (positions restart "
        "per sample, attention stays inside each sample), for training and evaluation.",
    )
    length_column_name: str = _arg("length", "Column with precomputed lengths for length grouping.")

    # -- devices and distributed --------------------------------------------------------------------
    use_cpu: bool = _arg(False, "Run on the CPU even if an accelerator is available.")
    local_rank: int = _arg(-1, "Local rank passed by old launchers (torchrun uses LOCAL_RANK).")
    ddp_backend: str | None = _arg(
        None, "Process-group backend (default: nccl on CUDA, gloo on CPU).", choices=DDP_BACKENDS
    )
    ddp_timeout: int = _arg(1800, "Process-group timeout in seconds.")
    ddp_find_unused_parameters: bool | None = _arg(None, "DDP find_unused_parameters.")
    ddp_bucket_cap_mb: int | None = _arg(None, "DDP bucket_cap_mb.")
    ddp_broadcast_buffers: bool | None = _arg(None, "DDP broadcast_buffers.")
    ddp_static_graph: bool | None = _arg(None, "DDP static_graph.")
    fsdp: list[str] | str | None = _arg(None, 'FSDP options, e.g. "full_shard auto_wrap".')
    fsdp_config: dict[str, Any] | str | None = _arg(None, "FSDP settings (dict, JSON string or JSON file).")
    deepspeed: dict | str | None = _arg(None, "DeepSpeed config (dict, JSON string or file path).")
    accelerator_config: dict | str | None = _arg(None, "Accelerator settings (dict, JSON or file).")
    parallelism_config: Any | None = _arg(
        None,
        "N-D parallel layout: accelerate's ParallelismConfig or a dict of dp_replicate_size, dp_shard_size, "
        "tp_size, cp_size (docs/parallelism.md).",
    )
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
    ray_scope: str | None = _arg("last", "Ray Tune's scope for the best trial: last, all, avg, last-<n>-avg.")
    sharded_ddp: list[str] | str | None = _arg(
        "", "FairScale sharded DDP (transformers < 4.35): refused, use fsdp."
    )

    def __post_init__(self) -> None:
        validation.validate(self)
        if not type(self).__module__.startswith("trainwright."):  # a library's config (TRL's)
            process_state.start_accelerate_state(self)
        process_state.check_configured_state(self)

    # ---------------------------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready values: enums as strings, dtypes as names, tokens redacted."""
        return serialization.to_dict(self)

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
        return cls(**serialization.from_dict_kwargs(cls, data))

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> "TrainingArguments":
        """Read arguments written by `to_json_file` (or transformers' `to_json_string`)."""
        return cls.from_dict(serialization.read_json_file(path))

    def to_sanitized_dict(self) -> dict[str, Any]:
        """`to_dict()` plus the batch sizes, with only int/float/str/bool/Tensor values (others as str)."""
        return serialization.to_sanitized_dict(self)

    def __str__(self) -> str:
        return serialization.describe(self)

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
        return properties.warmup_steps(self, num_training_steps)

    def get_process_log_level(self) -> int:
        """Log level for this process: `log_level` where `should_log`, else `log_level_replica`.

        "passive" gives transformers' verbosity, as upstream does, when transformers is imported (an
        example script's `transformers.utils.logging.set_verbosity_info()` makes it INFO); without
        transformers, the current level of the `trainwright` logger.
        """
        return properties.process_log_level(self)

    # -------------------------------------------------------------- devices and processes (lazy)

    @property
    def device(self) -> torch.device:
        """The device of this process."""
        return properties.runtime(self).device

    @property
    def n_gpu(self) -> int:
        """Accelerators used by this process: 0 on CPU, else 1 (there is no DataParallel)."""
        return 0 if self.device.type == "cpu" else 1

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return properties.runtime(self).world_size

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        return properties.runtime(self).rank

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node."""
        return properties.runtime(self).local_rank

    @property
    def parallel_mode(self) -> ParallelMode:
        """DISTRIBUTED with several processes, else NOT_PARALLEL."""
        return ParallelMode.DISTRIBUTED if self.world_size > 1 else ParallelMode.NOT_PARALLEL

    @property
    def should_log(self) -> bool:
        """Whether this process logs: each node's main process with log_on_each_node, else rank 0."""
        rt = properties.runtime(self)
        return rt.is_local_main_process if self.log_on_each_node else rt.is_main_process

    @property
    def should_save(self) -> bool:
        """Whether this process writes files: each node's main process with save_on_each_node, else rank 0."""
        rt = properties.runtime(self)
        return rt.is_local_main_process if self.save_on_each_node else rt.is_main_process

    @property
    def distributed_state(self) -> "process_state.ProcessState":
        """accelerate's view of this process (`distributed_type`, ranks, device): see process_state.py."""
        return process_state.process_state(self)

    @property
    def deepspeed_plugin(self) -> None:
        """None without `deepspeed` (accelerate's attribute; with it, an error naming it)."""
        return process_state.deepspeed_plugin(self)

    @property
    def place_model_on_device(self) -> bool:
        """Whether the Trainer moves the model to `device` (DeepSpeed places it itself)."""
        return not self.deepspeed

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        """Run the body on the (local) main process first, then on the others (e.g. dataset caching)."""
        rt = properties.runtime(self)
        logger.debug("process %d: %s, main %s process first", rt.rank, desc, "local" if local else "global")
        with rt.main_process_first(local=local):
            yield


@takes_removed_v4_args
@dataclass(repr=False)
class Seq2SeqTrainingArguments(TrainingArguments):
    """`TrainingArguments` plus the generation settings of `Seq2SeqTrainer`."""

    sortish_sampler: bool = _arg(
        False, 'v4: batches of similar lengths with randomness (train_sampling_strategy="group_by_length").'
    )
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
        validation.validate_seq2seq(self)

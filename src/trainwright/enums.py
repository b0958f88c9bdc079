"""String enums behind the choice-valued `TrainingArguments` fields.

Every enum mixes in `str`, so a member compares equal to its value (`args.eval_strategy == "steps"`),
serialises to JSON as that string and prints as it (`f"{IntervalStrategy.STEPS}"` is `"steps"`).
Building one from an unknown string raises `ValueError` listing the valid values.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class ChoiceEnum(str, Enum):
    """Base of trainwright's string enums: prints as its value, explains bad values."""

    def __str__(self) -> str:
        return str(self.value)

    # Python 3.11+ routes format() through Enum.__format__; keep f-strings equal to the value everywhere.
    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> list[str]:
        """The valid string values, in declaration order."""
        return [m.value for m in cls]

    @classmethod
    def _missing_(cls, value: Any) -> Any:
        raise ValueError(f"{value!r} is not a valid {cls.__name__}; choose one of {cls.values()}")


class IntervalStrategy(ChoiceEnum):
    """When to log or evaluate: never, every `*_steps` optimizer steps, or at each epoch end."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


# The v4 name of IntervalStrategy (removed upstream in v5); kept so that old imports work.
EvaluationStrategy = IntervalStrategy


class SaveStrategy(ChoiceEnum):
    """When to checkpoint; `best` saves whenever `metric_for_best_model` improves."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"
    BEST = "best"


class SchedulerType(ChoiceEnum):
    """Learning-rate schedules provided by `trainwright.schedules`."""

    LINEAR = "linear"
    COSINE = "cosine"
    COSINE_WITH_RESTARTS = "cosine_with_restarts"
    POLYNOMIAL = "polynomial"
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    INVERSE_SQRT = "inverse_sqrt"
    REDUCE_ON_PLATEAU = "reduce_lr_on_plateau"
    COSINE_WITH_MIN_LR = "cosine_with_min_lr"
    COSINE_WARMUP_WITH_MIN_LR = "cosine_warmup_with_min_lr"
    WARMUP_STABLE_DECAY = "warmup_stable_decay"


class OptimizerNames(ChoiceEnum):
    """Optimizers provided by `trainwright.optim` (upstream names).

    `adamw_hf` is accepted as the old spelling of `adamw_torch`; `TrainingArguments` maps it.
    """

    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAMW_TORCH_FOREACH = "adamw_torch_foreach"
    ADAFACTOR = "adafactor"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    RMSPROP = "rmsprop"
    ADAMW_HF = "adamw_hf"


class HubStrategy(ChoiceEnum):
    """What to push to the Hugging Face Hub (accepted for compatibility; trainwright never pushes)."""

    END = "end"
    EVERY_SAVE = "every_save"
    CHECKPOINT = "checkpoint"
    ALL_CHECKPOINTS = "all_checkpoints"


class ParallelMode(ChoiceEnum):
    """How this run is parallelised (`TrainingArguments.parallel_mode`)."""

    NOT_PARALLEL = "not_parallel"
    NOT_DISTRIBUTED = "not_distributed"
    DISTRIBUTED = "distributed"
    SAGEMAKER_MODEL_PARALLEL = "sagemaker_model_parallel"
    SAGEMAKER_DATA_PARALLEL = "sagemaker_data_parallel"
    TPU = "tpu"


class DebugOption(ChoiceEnum):
    """Values of the `debug` argument."""

    UNDERFLOW_OVERFLOW = "underflow_overflow"
    TPU_METRICS_DEBUG = "tpu_metrics_debug"


class FSDPOption(ChoiceEnum):
    """Words of the `fsdp` argument (v4 style: `"full_shard auto_wrap"`)."""

    FULL_SHARD = "full_shard"
    SHARD_GRAD_OP = "shard_grad_op"
    NO_SHARD = "no_shard"
    HYBRID_SHARD = "hybrid_shard"
    HYBRID_SHARD_ZERO2 = "hybrid_shard_zero2"
    OFFLOAD = "offload"
    AUTO_WRAP = "auto_wrap"


# FSDP sharding strategies: at most one may be named in `fsdp`.
FSDP_SHARDING_STRATEGIES = (
    FSDPOption.FULL_SHARD,
    FSDPOption.SHARD_GRAD_OP,
    FSDPOption.NO_SHARD,
    FSDPOption.HYBRID_SHARD,
    FSDPOption.HYBRID_SHARD_ZERO2,
)

__all__ = [
    "DebugOption",
    "EvaluationStrategy",
    "FSDPOption",
    "FSDP_SHARDING_STRATEGIES",
    "HubStrategy",
    "IntervalStrategy",
    "OptimizerNames",
    "ParallelMode",
    "SaveStrategy",
    "SchedulerType",
    "ChoiceEnum",
]

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
    """Learning-rate schedules provided by `trainwright.optim.schedules`."""

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
    GREEDY = "greedy"


class OptimizerNames(ChoiceEnum):
    """Optimizers provided by `trainwright.optim.optimizers` (upstream names).

    `adamw_hf` is accepted as the old spelling of `adamw_torch`; `TrainingArguments` maps it. The
    names after RMSPROP need an optional package (`pip install trainwright[optim]`) or a device;
    `trainwright.optim.extra` builds them or says what is missing.
    """

    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAMW_TORCH_FOREACH = "adamw_torch_foreach"
    ADAFACTOR = "adafactor"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    RMSPROP = "rmsprop"
    ADAMW_HF = "adamw_hf"
    ADAMW_TORCH_XLA = "adamw_torch_xla"
    ADAMW_TORCH_NPU_FUSED = "adamw_torch_npu_fused"
    ADAMW_APEX_FUSED = "adamw_apex_fused"
    ADAMW_ANYPRECISION = "adamw_anyprecision"
    ADAMW_TORCH_4BIT = "adamw_torch_4bit"
    ADAMW_TORCH_8BIT = "adamw_torch_8bit"
    ADEMAMIX = "ademamix"
    ADAMW_BNB = "adamw_bnb_8bit"
    ADAMW_8BIT = "adamw_8bit"
    ADEMAMIX_8BIT = "ademamix_8bit"
    LION_8BIT = "lion_8bit"
    LION = "lion_32bit"
    PAGED_ADAMW = "paged_adamw_32bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    PAGED_ADEMAMIX = "paged_ademamix_32bit"
    PAGED_ADEMAMIX_8BIT = "paged_ademamix_8bit"
    PAGED_LION = "paged_lion_32bit"
    PAGED_LION_8BIT = "paged_lion_8bit"
    RMSPROP_BNB = "rmsprop_bnb"
    RMSPROP_8BIT = "rmsprop_bnb_8bit"
    RMSPROP_32BIT = "rmsprop_bnb_32bit"
    GALORE_ADAMW = "galore_adamw"
    GALORE_ADAMW_8BIT = "galore_adamw_8bit"
    GALORE_ADAFACTOR = "galore_adafactor"
    GALORE_ADAMW_LAYERWISE = "galore_adamw_layerwise"
    GALORE_ADAMW_8BIT_LAYERWISE = "galore_adamw_8bit_layerwise"
    GALORE_ADAFACTOR_LAYERWISE = "galore_adafactor_layerwise"
    LOMO = "lomo"
    ADALOMO = "adalomo"
    GROKADAMW = "grokadamw"
    SCHEDULE_FREE_RADAM = "schedule_free_radam"
    SCHEDULE_FREE_ADAMW = "schedule_free_adamw"
    SCHEDULE_FREE_SGD = "schedule_free_sgd"
    APOLLO_ADAMW = "apollo_adamw"
    APOLLO_ADAMW_LAYERWISE = "apollo_adamw_layerwise"
    STABLE_ADAMW = "stable_adamw"


class HubStrategy(ChoiceEnum):
    """What to push to the Hugging Face Hub, and when (`TrainingArguments.hub_strategy`, hub.py)."""

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

"""`TrainingArguments` and `Seq2SeqTrainingArguments`, `AcceleratorConfig`, and `HfArgumentParser`."""

from trainwright.args.parser import (
    HfArg,
    HfArgumentParser,
    string_to_bool,
)
from trainwright.args.training_args import (
    V4_V5_CHOICES,
    DebugOption,
    EvaluationStrategy,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
    Seq2SeqTrainingArguments,
    TrainingArguments,
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
    "HfArg",
    "HfArgumentParser",
    "string_to_bool",
]

"""trainwright: the transformers.Trainer API on PyTorch, with exact resume, atomic checkpoints,
token-weighted gradient accumulation and honest throughput/MFU figures.

    from trainwright import Trainer, TrainingArguments
"""

from .argparser import HfArgumentParser
from .args import (
    IntervalStrategy,
    SaveStrategy,
    SchedulerType,
    Seq2SeqTrainingArguments,
    TrainingArguments,
)
from .callbacks import (
    DefaultFlowCallback,
    DivergenceCallback,
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    SpeedMonitor,
)
from .checkpoint import get_last_checkpoint
from .events import CallbackHandler, TrainerCallback
from .metrics import EvalPrediction, PredictionOutput, TrainOutput
from .schedules import get_scheduler
from .seed import enable_full_determinism, set_seed
from .seq2seq import Seq2SeqTrainer
from .state import TrainerControl, TrainerState
from .trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "CallbackHandler",
    "DefaultFlowCallback",
    "DivergenceCallback",
    "EarlyStoppingCallback",
    "EvalPrediction",
    "HfArgumentParser",
    "IntervalStrategy",
    "PredictionOutput",
    "PrinterCallback",
    "ProgressCallback",
    "SaveStrategy",
    "SchedulerType",
    "Seq2SeqTrainer",
    "Seq2SeqTrainingArguments",
    "SpeedMonitor",
    "TrainOutput",
    "Trainer",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "TrainingArguments",
    "enable_full_determinism",
    "get_last_checkpoint",
    "get_scheduler",
    "set_seed",
]

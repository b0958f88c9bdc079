"""trainwright: the transformers.Trainer API on PyTorch, with exact resume, atomic checkpoints,
token-weighted gradient accumulation and honest throughput/MFU figures.

    from trainwright import Trainer, TrainingArguments
"""

from trainwright.args import foreign as _foreign
from trainwright.args.parser import HfArgumentParser
from trainwright.args.training_args import (
    IntervalStrategy,
    SaveStrategy,
    SchedulerType,
    Seq2SeqTrainingArguments,
    TrainingArguments,
)
from trainwright.callbacks import (
    DefaultFlowCallback,
    DivergenceCallback,
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    SpeedMonitor,
)
from trainwright.checkpoint.folder import get_last_checkpoint
from trainwright.core.events import CallbackHandler, TrainerCallback
from trainwright.core.seed import enable_full_determinism, set_seed
from trainwright.core.state import TrainerControl, TrainerState
from trainwright.core.version import __version__ as __version__
from trainwright.data import default_data_collator
from trainwright.integrations import (
    is_clearml_available,
    is_comet_available,
    is_dvclive_available,
    is_neptune_available,
    is_optuna_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_wandb_available,
)
from trainwright.loop.seq2seq import Seq2SeqTrainer
from trainwright.loop.trainer import Trainer
from trainwright.observe.metrics import EvalPrediction, PredictionOutput, TrainOutput
from trainwright.optim.schedules import (
    get_constant_schedule,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
    get_greedy_schedule,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
    get_polynomial_decay_schedule_with_warmup,
    get_reduce_on_plateau_schedule,
    get_scheduler,
    get_wsd_schedule,
)
from trainwright.patch import PatchTooLateError, patch_transformers
from trainwright.trainer_utils import torch_distributed_zero_first

# transformers' TrainingArguments note what they were given, so that converting one keeps an explicit
# choice equal to transformers' default (args/foreign.py)
_foreign.watch()

_TF_NAMES = ("TFTrainer", "TFTrainingArguments")


def __getattr__(name: str):
    # TensorFlow is imported only when a TF name is asked for (ImportError naming the `tf` extra).
    if name in _TF_NAMES:
        from trainwright import tf as _tf

        return getattr(_tf, name)
    raise AttributeError(f"module 'trainwright' has no attribute {name!r}")


__all__ = [
    "CallbackHandler",
    "DefaultFlowCallback",
    "DivergenceCallback",
    "EarlyStoppingCallback",
    "EvalPrediction",
    "HfArgumentParser",
    "IntervalStrategy",
    "PatchTooLateError",
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
    "default_data_collator",
    "enable_full_determinism",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
    "get_greedy_schedule",
    "get_inverse_sqrt_schedule",
    "get_last_checkpoint",
    "get_linear_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_reduce_on_plateau_schedule",
    "get_scheduler",
    "get_wsd_schedule",
    "is_clearml_available",
    "is_comet_available",
    "is_dvclive_available",
    "is_neptune_available",
    "is_optuna_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_wandb_available",
    "patch_transformers",
    "set_seed",
    "torch_distributed_zero_first",
]

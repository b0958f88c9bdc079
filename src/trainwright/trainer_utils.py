"""`trainwright.trainer_utils`: the names scripts import from `transformers.trainer_utils`.

    from trainwright.trainer_utils import get_last_checkpoint, is_main_process

Each name is trainwright's own implementation (the same object as elsewhere in the package); only
names whose call signature matches transformers' are here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from trainwright.checkpoint.files import PREFIX_CHECKPOINT_DIR
from trainwright.checkpoint.folder import get_last_checkpoint
from trainwright.core.enums import (
    EvaluationStrategy,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    SaveStrategy,
    SchedulerType,
)
from trainwright.core.seed import enable_full_determinism, seed_worker, set_seed
from trainwright.data import has_length as _has_length
from trainwright.loop.search.hpo import default_compute_objective, default_hp_space_optuna
from trainwright.observe.metrics import (
    BestRun,
    EvalLoopOutput,
    EvalPrediction,
    PredictionOutput,
    TrainOutput,
    denumpify_detensorize,
    speed_metrics,
)

__all__ = [
    "PREFIX_CHECKPOINT_DIR",
    "BestRun",
    "EvalLoopOutput",
    "EvalPrediction",
    "EvaluationStrategy",
    "FSDPOption",
    "HubStrategy",
    "IntervalStrategy",
    "PredictionOutput",
    "SaveStrategy",
    "SchedulerType",
    "TrainOutput",
    "default_compute_objective",
    "default_hp_space_optuna",
    "denumpify_detensorize",
    "enable_full_determinism",
    "get_last_checkpoint",
    "has_length",
    "is_main_process",
    "seed_worker",
    "set_seed",
    "speed_metrics",
    "torch_distributed_zero_first",
    "total_processes_number",
]


def has_length(dataset: Any) -> bool:
    """Whether `dataset` has a usable `len()` (transformers' name for the argument)."""
    return _has_length(dataset)


def is_main_process(local_rank: int) -> bool:
    """Whether this is its node's main process: `local_rank` is -1 (not distributed) or 0."""
    return local_rank in (-1, 0)


def total_processes_number(local_rank: int) -> int:
    """The number of processes: the process group's size when distributed (`local_rank` != -1)."""
    if local_rank != -1 and dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


@contextlib.contextmanager
def torch_distributed_zero_first(local_rank: int) -> Iterator[None]:
    """Let the local main process run the block first (e.g. to build a dataset cache) while the
    others wait at a barrier, then run it on the others. Needs a process group unless
    `local_rank` is -1 or 0."""
    if local_rank not in (-1, 0):
        dist.barrier()
    yield
    if local_rank == 0 and dist.is_available() and dist.is_initialized():
        dist.barrier()

"""The decisions a run takes once (`RunPlan`) and the counters it starts from (`RunStart`).

Both are frozen: a resume in another batch geometry that re-sizes a run sized by epochs is a finding
of the data state's check (`data_state.PositionFinding`), which the checkpointer applies as a
new plan (`dataclasses.replace`); the metric-driven scheduler is known once the optimizer exists,
and `TrainingRun.start` completes the plan with it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch


@dataclasses.dataclass(frozen=True, slots=True)
class RunPlan:
    """What a run decided at its start: its length, its trial, how it counts FLOPs and input tokens,
    which upstream hooks it calls every step, and the facts of its processes."""

    epochs: int
    max_steps: int
    trial: Any = None
    ignore_keys_for_eval: list[str] | None = None
    # FLOPs of a micro-batch from it and its tokens (else samples): an overridden floating_point_ops,
    # or a callback that needs exact FLOPs, counts each batch; else 6 x non-embedding parameters per token
    count_flops: Callable[[Any, int], Any] = lambda _inputs, _tokens: 0
    count_input_tokens: Callable[[Mapping[str, Any]], int] = lambda _inputs: 0
    custom_lse: bool = False  # a subclass overrides _maybe_log_save_evaluate: called every step
    metric_scheduler: bool = False  # the scheduler steps on the evaluation metric, not per step
    resumed_loader: Callable[[Any, int], Any] | None = None  # a subclass's get_resumed_dataloader
    # facts of the processes, fixed for the run
    distributed: bool = False
    data_world_size: int = 1
    # a flag every process must agree on (any of them): with one process, the flag itself
    agree: Callable[[bool], bool] = bool


def flop_counter(count_flops: Callable[[Any], Any] | None, per_token: int) -> Callable[[Any, int], Any]:
    """A micro-batch's FLOPs: the exact count (an overridden `floating_point_ops`), else per token."""
    if count_flops is not None:
        return lambda inputs, _tokens: count_flops(inputs)
    return lambda _inputs, tokens: per_token * tokens


def input_token_counter(mode: str) -> Callable[[Mapping[str, Any]], int]:
    """`include_num_input_tokens_seen`: "no", "all" or "non_padding"."""
    return _no_tokens if mode == "no" else partial(_input_tokens, mode=mode)


@dataclasses.dataclass(frozen=True, slots=True)
class RunStart:
    """The counters this `train()` call starts from (a resumed run's, restored), and its start time."""

    time: float = dataclasses.field(default_factory=time.time)
    samples: int = 0
    tokens: int = 0
    input_tokens: int = 0


def _no_tokens(inputs: Mapping[str, Any]) -> int:
    return 0


def _input_tokens(inputs: Mapping[str, Any], mode: str) -> int:
    """Every input token, or with "non_padding" the attended ones."""
    mask = inputs.get("attention_mask")
    if mode == "non_padding" and isinstance(mask, torch.Tensor):
        return int(mask.sum())
    ids = inputs.get("input_ids")
    return ids.numel() if isinstance(ids, torch.Tensor) else 0

"""Shared helpers for the reporter tests: real TrainingArguments/TrainerState, a tiny model with a
config, and a driver that fires events through the real CallbackHandler as the Trainer does."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from trainwright.args.training_args import TrainingArguments
from trainwright.core.events import CallbackHandler
from trainwright.core.state import TrainerControl, TrainerState


@dataclasses.dataclass
class TinyConfig:
    hidden_size: int = 4
    model_type: str = "tiny"


class TinyModel(torch.nn.Module):
    """A linear layer with a `config`, enough for every reporter's model handling."""

    def __init__(self) -> None:
        super().__init__()
        self.config = TinyConfig()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def make_args(output_dir: Any, run_name: str | None = "run-1", **kwargs: Any) -> TrainingArguments:
    return TrainingArguments(output_dir=str(output_dir), run_name=run_name, **kwargs)


def make_state(**kwargs: Any) -> TrainerState:
    return TrainerState(**kwargs)


def write_checkpoint(output_dir: Any, step: int) -> str:
    """A small checkpoint folder as the trainer writes it (contents do not matter to reporters)."""
    path = os.path.join(str(output_dir), f"checkpoint-{step}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(b"\0" * 16)
    return path


def handler_for(callbacks: Sequence[Any], model: Any = None) -> CallbackHandler:
    # The handler warns when no DefaultFlowCallback is present; these tests drive flags themselves.
    logger = logging.getLogger("trainwright.core.events")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return CallbackHandler(list(callbacks), model, None, None, None)
    finally:
        logger.setLevel(level)


def drive(
    callbacks: Sequence[Any] | Any,
    args: TrainingArguments,
    logs: Iterable[tuple[int, dict[str, Any]]],
    *,
    state: TrainerState | None = None,
    model: Any = None,
    save_steps: Iterable[int] = (),
    train_end: bool = True,
) -> TrainerState:
    """Fire init_end, train_begin, then per (step, logs): log (and save at `save_steps`, after
    writing a checkpoint folder), then train_end; as the Trainer orders them."""
    handler = handler_for(callbacks if isinstance(callbacks, (list, tuple)) else [callbacks], model)
    state = state or make_state()
    control = TrainerControl()
    saves = set(save_steps)
    handler.on_init_end(args, state, control)
    handler.on_train_begin(args, state, control)
    for step, row in logs:
        state.global_step = step
        state.epoch = step / 10
        state.log_history.append({**row, "step": step})
        handler.on_log(args, state, control, logs=dict(row))
        if step in saves:
            write_checkpoint(args.output_dir, step)
            handler.on_save(args, state, control)
    if train_end:
        handler.on_train_end(args, state, control)
    return state

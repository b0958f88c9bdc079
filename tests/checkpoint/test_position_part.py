"""The run's position is the "data_state" part: its check says what it found and changes nothing;
the checkpointer applies the finding (a re-sized run gets a new plan)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader

from trainwright.checkpoint import TRAINER_STATE_NAME
from trainwright.core.state import TrainerState
from trainwright.loop.checkpoints.data_state import DataState, PositionFinding
from trainwright.loop.run.loss_log import LossLog
from trainwright.loop.run.plan import RunPlan
from trainwright.loop.run.position import Position


def _data_state(args, plan: RunPlan) -> DataState:
    loader = DataLoader(list(range(16)), batch_size=2)
    position = Position(loader, 8, lambda _inputs, tokens: tokens, lambda _inputs: 0)
    losses = LossLog(position, SimpleNamespace(device=torch.device("cpu")), filtering=True)
    return DataState(args, position, losses, plan, TrainerState())


def test_the_check_of_a_checkpoint_without_data_state_returns_its_position_and_writes_nothing(
    make_args, tmp_path
):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / TRAINER_STATE_NAME).write_text(json.dumps({"global_step": 3, "epoch": 0.375}))
    args = make_args(num_train_epochs=2, per_device_train_batch_size=2)
    plan = RunPlan(epochs=2, max_steps=16)
    part = _data_state(args, plan)
    before = part.position.cursor.to_dict()

    found = part.check(None, os.fspath(folder))

    assert isinstance(found, PositionFinding) and found.resized_to is None
    assert found.absent is not None and found.absent.steps_applied == 3
    assert part.position.cursor.to_dict() == before  # the check moved nothing
    assert part.plan is plan and part.max_steps == 16
    part.load_absent(os.fspath(folder))  # the load applies what the check found
    assert part.position.cursor.steps_applied == 3


def test_a_finding_that_resizes_the_run_gives_the_schedule_its_steps_not_the_plan(make_args):
    part = _data_state(make_args(), RunPlan(epochs=2, max_steps=16))
    part.found = PositionFinding(resized_to=11)
    assert part.max_steps == 11 and part.plan.max_steps == 16  # the checkpointer replaces the plan

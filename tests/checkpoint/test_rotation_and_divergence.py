"""Rotation never loses the checkpoint that matters: after a run's loss goes non-finite, the newest
checkpoint written before it is kept (and named at the end of train()); a new run into a folder
holding another run's checkpoints keeps its own and leaves the other run's alone, and says so."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from conftest import VectorDataset
from torch import nn

from trainwright import DivergenceCallback, Trainer
from trainwright.checkpoint import get_last_checkpoint


class Poisoned(VectorDataset):
    """One sample with a NaN input (or label): the step that takes it has a NaN loss, and the
    weights after it are NaN, so every later step is non-finite too."""

    def __init__(self, where: str = "input", index: int = 18, **kw):
        super().__init__(**kw)
        if where == "input":
            self.x[index, 0] = float("nan")
        else:
            self.y[index] = float("nan")


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(8, 1)

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def _names(folder) -> list[str]:
    return sorted(
        (e for e in os.listdir(folder) if e.startswith("checkpoint-")), key=lambda n: int(n.split("-")[1])
    )


@pytest.mark.parametrize("where", ["input", "label"])
@pytest.mark.parametrize("logging_steps", [1, 1000], ids=["logged", "found-at-save"])
def test_the_last_finite_checkpoint_survives_rotation_and_is_named(
    make_args, tmp_path, caplog, where, logging_steps
):
    out = tmp_path / "out"

    def train(max_steps, resume=None):
        args = make_args(
            output_dir=str(out),
            per_device_train_batch_size=4,
            max_steps=max_steps,
            save_strategy="steps",
            save_steps=2,
            save_total_limit=2,
            logging_steps=logging_steps,
            train_sampling_strategy="sequential",
        )
        # sample 18 is in the 5th batch of 4: steps 1-4 are finite, step 5 and every later one are not
        Trainer(model=Linear(), args=args, train_dataset=Poisoned(where, n=64)).train(
            resume_from_checkpoint=resume
        )

    with caplog.at_level(logging.WARNING, logger="trainwright"):
        train(10)  # returns normally: nothing stops it
    assert _names(out) == ["checkpoint-4", "checkpoint-8", "checkpoint-10"]
    assert "not finite from step 5 on; the last checkpoint written before it is" in caplog.text
    assert os.path.join(str(out), "checkpoint-4") in caplog.text
    # a resumed run keeps protecting it: the checkpoint's data_state says where the divergence began
    train(12, resume=str(out / "checkpoint-10"))
    assert _names(out) == ["checkpoint-4", "checkpoint-10", "checkpoint-12"]


def test_a_finite_run_rotates_as_before(make_args, tmp_path, caplog):
    args = make_args(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=10,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=2,
    )
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        Trainer(model=Linear(), args=args, train_dataset=VectorDataset(n=64)).train()
    assert _names(tmp_path) == ["checkpoint-8", "checkpoint-10"]
    assert "not finite" not in caplog.text


def test_divergence_callback_still_stops_a_diverged_run(make_args, tmp_path):
    args = make_args(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=10,
        logging_steps=1,
        train_sampling_strategy="sequential",
    )
    trainer = Trainer(
        model=Linear(), args=args, train_dataset=Poisoned(n=64), callbacks=[DivergenceCallback()]
    )
    trainer.train()
    assert trainer.state.global_step == 5


def _run(make_args, out, max_steps, resume=None, **kw):
    kw.setdefault("save_total_limit", 2)
    args = make_args(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=5,
        **kw,
    )
    trainer = Trainer(model=Linear(), args=args, train_dataset=VectorDataset(n=64))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_a_new_run_keeps_its_checkpoints_beside_another_runs(make_args, tmp_path, caplog):
    _run(make_args, tmp_path, 25)
    assert _names(tmp_path) == ["checkpoint-20", "checkpoint-25"]
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        _run(make_args, tmp_path, 10)
    # its own newest two, and the other run's untouched (neither counted nor deleted)
    assert _names(tmp_path) == ["checkpoint-5", "checkpoint-10", "checkpoint-20", "checkpoint-25"]
    assert "holds 2 checkpoint(s) this run does not continue (newest: checkpoint-25)" in caplog.text
    assert "resume_from_checkpoint=" in caplog.text and "another output_dir" in caplog.text
    assert get_last_checkpoint(str(tmp_path)).endswith("checkpoint-25")  # the highest step, as said


def test_a_resume_from_an_earlier_checkpoint_names_the_later_ones(make_args, tmp_path, caplog):
    _run(make_args, tmp_path, 25, save_total_limit=None)
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        _run(make_args, tmp_path, 30, resume=str(tmp_path / "checkpoint-10"))
    assert "holds 3 checkpoint(s) this run does not continue (newest: checkpoint-25)" in caplog.text
    # the resumed run rewrote 15, 20 and 25 as it reached them and rotated its own to the newest two
    assert _names(tmp_path) == ["checkpoint-25", "checkpoint-30"]


def test_after_falling_back_from_a_damaged_newest_checkpoint_it_is_not_advised(make_args, tmp_path, caplog):
    _run(make_args, tmp_path, 25, save_total_limit=None)
    newest = tmp_path / "checkpoint-25"
    with open(newest / "optimizer.pt", "r+b") as f:
        f.truncate(10)  # damaged: a resume falls back to checkpoint-20
    with (
        caplog.at_level(logging.WARNING, logger="trainwright"),
        pytest.warns(UserWarning, match="checkpoint-25"),
    ):
        trainer = _run(make_args, tmp_path, 30, resume=True, save_total_limit=None)
    assert trainer.cursor.first_step_of_call == 20
    line = next(m for m in caplog.messages if "does not continue" in m)
    assert "1 damaged" in line and "checkpoint-25'" not in line and "none of them is complete" in line

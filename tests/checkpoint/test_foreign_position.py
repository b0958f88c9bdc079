"""A checkpoint without trainwright's data position (transformers', or one whose data_state.json was
lost) resumed with another batch geometry: the position is the checkpoint's epoch from its
trainer_state.json, not its global_step read in the new geometry, so no part of the epoch is skipped."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

transformers = pytest.importorskip("transformers")

import trainwright  # noqa: E402


class Indexed(Dataset):
    """40 samples that record which of them were read."""

    def __init__(self) -> None:
        self.read: list[int] = []

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict:
        self.read.append(i)
        return {"x": torch.tensor([float(i)]), "labels": torch.tensor(float(i))}


class Line(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x, labels=None):
        return {"loss": ((x.squeeze(-1) * self.w - labels) ** 2).mean()}


def _args(lib, out, **kw):
    mod = transformers if lib == "transformers" else trainwright
    base = dict(output_dir=out, report_to="none", use_cpu=True, disable_tqdm=True, learning_rate=1e-4, seed=7)
    return mod.TrainingArguments(**{**base, **kw})


def test_a_transformers_checkpoint_resumed_with_a_larger_batch_trains_the_rest_of_its_epoch(tmp_path, caplog):
    out = str(tmp_path / "out")
    first = Indexed()
    # transformers: batches of 4, 10 steps an epoch, a checkpoint at step 5 (half the epoch)
    args = _args("transformers", out, per_device_train_batch_size=4, num_train_epochs=1, save_steps=5)
    transformers.Trainer(model=Line(), args=args, train_dataset=first).train()
    checkpoint = os.path.join(out, "checkpoint-5")
    assert not os.path.exists(os.path.join(checkpoint, "data_state.json"))
    seen_before = set(first.read[:20])  # the first 5 steps' samples (the run went on to 10)
    # trainwright resumes it with batches of 8: step 5 would be the end of epoch 0 in this geometry
    second = Indexed()
    args = _args("trainwright", str(tmp_path / "again"), per_device_train_batch_size=8, num_train_epochs=1)
    trainer = trainwright.Trainer(model=Line(), args=args, train_dataset=second)
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        trainer.train(resume_from_checkpoint=checkpoint)
    assert "trainer_state.json says epoch 0.5" in caplog.text
    assert seen_before | set(second.read) == set(range(40))  # the whole epoch, none of it skipped
    assert len(second.read) == 24  # from sample 16: rounded down to a whole batch of 8

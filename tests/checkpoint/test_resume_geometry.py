"""Resuming where a checkpoint cannot simply continue: another batch size (continue at the same
sample: none twice, none skipped, one warning), a run that has nothing left to train (said, naming
both numbers), an impossible global_step (refused), another number of dataloader workers (warned)."""

from __future__ import annotations

import json
import logging
import math
import os

import pytest
import torch
from conftest import VectorDataset

from trainwright import Trainer


class Recording(VectorDataset):
    """Records every index it serves."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.served: list[int] = []

    def __getitem__(self, i):
        self.served.append(int(i))
        return super().__getitem__(i)


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x, labels=None):
        out = self.lin(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def _train(make_args, out, resume=None, data=None, **kw):
    args = make_args(output_dir=str(out), save_strategy="steps", **kw)
    data = data if data is not None else Recording(n=64)
    trainer = Trainer(model=Linear(), args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, data


@pytest.mark.parametrize("new_batch,new_accumulation", [(4, 1), (16, 1), (4, 4)])
def test_another_batch_size_continues_at_the_same_sample(
    make_args, tmp_path, caplog, new_batch, new_accumulation
):
    common = {"num_train_epochs": 2, "save_steps": 3}
    _, whole = _train(make_args, tmp_path / "a", per_device_train_batch_size=8, **common)
    order = whole.served  # the seeded order of both epochs, 128 samples
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        resumed, data = _train(
            make_args,
            tmp_path / "a",
            resume=str(tmp_path / "a" / "checkpoint-3"),
            per_device_train_batch_size=new_batch,
            gradient_accumulation_steps=new_accumulation,
            **common,
        )
    assert data.served == order[24:]  # checkpoint-3 had trained the first 24: the rest, once each
    assert (
        "Resuming" in caplog.text and "with another batch: per_device_train_batch_size 8 -> " in caplog.text
    )
    assert "no sample is trained twice or skipped" in caplog.text
    # the schedule is sized for the steps left in the new geometry, and ends at them
    steps_left = math.ceil(math.ceil(40 / new_batch) / new_accumulation) + math.ceil(
        math.ceil(64 / new_batch) / new_accumulation
    )
    assert resumed.state.global_step == resumed.state.max_steps == 3 + steps_left
    assert resumed.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)


def test_the_same_global_batch_split_otherwise_stays_exact_and_quiet(make_args, tmp_path, caplog):
    common = {"num_train_epochs": 1, "save_steps": 2, "learning_rate": 0.1}
    whole, _ = _train(make_args, tmp_path / "a", per_device_train_batch_size=8, **common)
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        resumed, _ = _train(
            make_args,
            tmp_path / "b",
            resume=str(tmp_path / "a" / "checkpoint-2"),
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            **common,
        )
    assert "another batch" not in caplog.text
    for k, v in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[k], v, rtol=1e-6, atol=1e-7)


def test_a_changed_dataset_length_is_still_refused(make_args, tmp_path):
    _train(make_args, tmp_path, per_device_train_batch_size=8, max_steps=4, save_steps=2)
    with pytest.raises(ValueError, match="dataset_length: 64 in the checkpoint, 48 now"):
        _train(
            make_args,
            tmp_path,
            resume=str(tmp_path / "checkpoint-2"),
            data=Recording(n=48),
            per_device_train_batch_size=8,
            max_steps=4,
            save_steps=2,
        )


@pytest.mark.parametrize("limit", ["max_steps", "num_train_epochs"])
def test_a_resume_with_nothing_left_says_so(make_args, tmp_path, caplog, limit):
    _train(make_args, tmp_path, per_device_train_batch_size=8, num_train_epochs=2, save_steps=10)
    kw = {"max_steps": 5} if limit == "max_steps" else {"num_train_epochs": 1}
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        trainer, data = _train(
            make_args,
            tmp_path,
            resume=str(tmp_path / "checkpoint-10"),
            per_device_train_batch_size=8,
            save_steps=10,
            **kw,
        )
    assert trainer.state.global_step == 10 and data.served == []
    expected = (
        "this run ends at max_steps=5" if limit == "max_steps" else "this run ends at num_train_epochs=1"
    )
    assert expected in caplog.text and "train() returns after 0 steps" in caplog.text


def test_an_impossible_global_step_is_refused(make_args, tmp_path):
    _train(make_args, tmp_path, per_device_train_batch_size=8, max_steps=4, save_steps=2)
    state_file = tmp_path / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["global_step"] = 10**12
    state_file.write_text(json.dumps(state))
    os.remove(tmp_path / "checkpoint-2" / "checkpoint_complete.json")  # as a hand edit would leave it
    with pytest.raises(ValueError, match=r"global_step=1000000000000, which no run of max_steps=4 reaches"):
        _train(
            make_args,
            tmp_path,
            resume=str(tmp_path / "checkpoint-2"),
            per_device_train_batch_size=8,
            max_steps=8,
        )


def test_changed_dataloader_workers_are_named_in_a_warning(make_args, tmp_path, caplog):
    _train(make_args, tmp_path, per_device_train_batch_size=8, max_steps=4, save_steps=2)
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        _train(
            make_args,
            tmp_path,
            resume=str(tmp_path / "checkpoint-2"),
            per_device_train_batch_size=8,
            max_steps=4,
            save_steps=2,
            dataloader_num_workers=1,
        )
    assert "dataloader_num_workers=1, the checkpoint's run had 0" in caplog.text

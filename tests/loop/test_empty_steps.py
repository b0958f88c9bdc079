"""A step whose batches hold no label target at all (every label -100) has no loss: it contributes
nothing (no gradient, no update), is counted as a step, and is neither logged as NaN nor taken for a
divergence; the run's train_loss is the mean over the steps that had targets."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from conftest import tiny_gpt2
from torch.utils.data import Dataset

from trainwright import DivergenceCallback, Trainer, TrainerCallback


class Tokens(Dataset):
    """16 token rows; rows of `empty` have every label ignored."""

    def __init__(self, empty: set[int], n: int = 16, seq: int = 12):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 64, (n, seq), generator=g)
        self.empty = empty

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = torch.full_like(self.ids[i], -100) if i in self.empty else self.ids[i].clone()
        return {"input_ids": self.ids[i], "labels": labels}


class Watch(TrainerCallback):
    """The weights before and after each step."""

    def __init__(self):
        self.before: dict[int, torch.Tensor] = {}
        self.changed: dict[int, bool] = {}

    def on_step_begin(self, args, state, control, model=None, **kw):
        self.before[state.global_step + 1] = torch.cat(
            [p.detach().flatten().clone() for p in model.parameters()]
        )

    def on_step_end(self, args, state, control, model=None, **kw):
        now = torch.cat([p.detach().flatten() for p in model.parameters()])
        self.changed[state.global_step] = not torch.equal(now, self.before[state.global_step])


@pytest.mark.parametrize("ga", [1, 2])
def test_a_step_without_targets_has_no_loss_and_no_update(make_args, ga):
    bs = 4 // ga
    empty = {8, 9, 10, 11}  # the third step's rows (sequential order)
    watch = Watch()
    args = make_args(
        per_device_train_batch_size=bs,
        gradient_accumulation_steps=ga,
        max_steps=4,
        logging_steps=1,
        optim="adamw_torch",
        weight_decay=0.1,
        train_sampling_strategy="sequential",
    )
    trainer = Trainer(
        model=tiny_gpt2(), args=args, train_dataset=Tokens(empty), callbacks=[watch, DivergenceCallback()]
    )
    out = trainer.train()
    assert out.global_step == 4  # counted, and nothing stopped the run
    rows = [r for r in trainer.state.log_history if "step" in r and "train_loss" not in r]
    assert "loss" not in rows[2] and rows[2]["steps_without_targets"] == 1
    assert all(math.isfinite(r["loss"]) for i, r in enumerate(rows) if i != 2)
    assert watch.changed == {1: True, 2: True, 3: False, 4: True}  # no update at all, not even decay
    others = [r["loss"] for i, r in enumerate(rows) if i != 2]
    assert out.training_loss == pytest.approx(sum(others) / 3)


def test_a_run_of_only_empty_steps_logs_no_loss_and_says_its_train_loss_is_nan(make_args, caplog):
    args = make_args(
        per_device_train_batch_size=4, max_steps=2, logging_steps=2, train_sampling_strategy="sequential"
    )
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(set(range(8))))
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        out = trainer.train()
    row = next(r for r in trainer.state.log_history if "steps_without_targets" in r)
    assert "loss" not in row and row["steps_without_targets"] == 2
    assert math.isnan(out.training_loss)  # no step had a loss: not a healthy-looking 0.0
    assert math.isnan(trainer.state.log_history[-1]["train_loss"])
    assert caplog.text.count("No step of this run had a label target") == 1


def test_an_empty_step_survives_an_exact_resume(make_args, tmp_path):
    def train(resume=None, max_steps=4):
        torch.manual_seed(0)
        args = make_args(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            max_steps=max_steps,
            logging_steps=4,
            save_strategy="steps",
            save_steps=3,
            train_sampling_strategy="sequential",
        )
        trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens({8, 9, 10, 11}))
        return trainer, trainer.train(resume_from_checkpoint=resume)

    whole, whole_out = train()
    resumed, resumed_out = train(resume=str(tmp_path / "checkpoint-3"))
    assert resumed_out.training_loss == whole_out.training_loss
    assert resumed.state.log_history[-2] == whole.state.log_history[-2]  # the same window row

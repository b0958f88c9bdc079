"""Arguments that shape what the loop reports or feeds back (issue 8, point 5):
include_tokens_per_second / per-row tokens per second, and past_index."""

from __future__ import annotations

import os

import torch
from args_kit import (
    TokenData,
    evaluating_trainer_fixture,  # noqa: F401  (the evaluating_trainer fixture)
)
from conftest import RegressionDataset, tiny_gpt2
from torch import nn
from torch.utils.data import Dataset

from trainwright import Trainer

# ---------------------------------------------------------------------------- tokens per second


def assert_rate(rate: float, runtime: float, tokens: int) -> None:
    """rate == tokens / runtime up to the rounding of the logged values (runtime to 4 decimals, rate to 3)."""
    assert runtime > 0
    assert abs(rate * runtime - tokens) <= rate * 5e-5 + runtime * 5e-4 + 1e-9


def test_include_tokens_per_second_is_tokens_over_runtime(make_args):
    data = TokenData(n=16, seq=12)
    args = make_args(include_tokens_per_second=True, num_train_epochs=2, per_device_train_batch_size=4)
    out = Trainer(model=tiny_gpt2(), args=args, train_dataset=data).train()
    tokens = 2 * 16 * 12
    assert_rate(out.metrics["train_tokens_per_second"], out.metrics["train_runtime"], tokens)

    plain = Trainer(model=tiny_gpt2(), args=make_args(max_steps=1), train_dataset=data).train()
    assert "train_tokens_per_second" not in plain.metrics


def test_per_row_tokens_per_second_counts_this_call_only(make_args, tmp_path):
    data = TokenData(n=16, seq=12)
    args = make_args(
        include_num_input_tokens_seen="all",
        per_device_train_batch_size=4,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        output_dir=str(tmp_path / "out"),
    )
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=data)
    trainer.train()
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert [r["num_input_tokens_seen"] for r in rows] == [48, 96, 144, 192]
    for r in rows:
        assert_rate(r["train_tokens_per_second"], r["train_runtime"], r["num_input_tokens_seen"])

    resumed = Trainer(model=tiny_gpt2(), args=args, train_dataset=data)
    resumed.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-2"))
    rows = [r for r in resumed.state.log_history if "loss" in r and r["step"] > 2]
    assert [r["num_input_tokens_seen"] for r in rows] == [144, 192]
    for r in rows:  # only the tokens of this call, over this call's time
        assert_rate(r["train_tokens_per_second"], r["train_runtime"], r["num_input_tokens_seen"] - 96)


# ----------------------------------------------------------------------------------- past_index


class MemoryModel(nn.Module):
    """Returns (loss, prediction, memory); the memory names the forward that made it, and every
    forward records the memory it was given."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.calls = 0
        self.received: list[tuple[str, float | None]] = []

    def forward(self, input_x, labels=None, mems=None):
        self.calls += 1
        phase = "train" if self.training else "eval"
        self.received.append((phase, None if mems is None else float(mems)))
        y = input_x * self.w + (0.0 if mems is None else 0.0 * mems)
        memory = torch.tensor(float(self.calls))
        if labels is None:
            return (y, memory)
        return (nn.functional.mse_loss(y, labels), y, memory)


def test_past_index_feeds_outputs_back_as_mems_and_resets(evaluating_trainer):
    model = MemoryModel()
    trainer = evaluating_trainer(
        2, model, RegressionDataset(length=12), past_index=2, per_device_eval_batch_size=6, num_train_epochs=2
    )
    trainer.train()
    # steps 1-3 are epoch 1, 4-6 epoch 2; evaluations (2 batches) after steps 2, 4 and 6
    assert model.received == [
        ("train", None),  # step 1 (call 1)
        ("train", 1.0),  # step 2 gets call 1's memory
        ("eval", None),  # an evaluation starts with no memory (call 3)...
        ("eval", 3.0),
        ("train", 2.0),  # ...and leaves the training memory as it was (step 3)
        ("train", None),  # a new epoch starts with no memory (step 4, call 6)
        ("eval", None),
        ("eval", 7.0),
        ("train", 6.0),  # step 5
        ("train", 9.0),  # step 6
        ("eval", None),
        ("eval", 11.0),
    ]


def test_past_index_without_labels_reads_one_place_earlier(make_args):
    class Unlabelled(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"input_x": torch.tensor(float(i))}

    args = make_args(past_index=2, per_device_eval_batch_size=2)
    model = MemoryModel()
    trainer = Trainer(model=model, args=args)
    trainer.predict(Unlabelled())  # outputs (prediction, memory): the memory is at past_index - 1
    assert model.received == [("eval", None), ("eval", 1.0), ("eval", 2.0)]


def test_past_index_off_passes_no_mems(make_args):
    model = MemoryModel()
    args = make_args(per_device_train_batch_size=4, max_steps=3)
    Trainer(model=model, args=args, train_dataset=RegressionDataset(length=12)).train()
    assert all(m is None for _, m in model.received)

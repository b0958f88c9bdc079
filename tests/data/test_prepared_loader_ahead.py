"""A data loader a Trainer subclass builds itself and hands to `trainer.accelerator.prepare` (GLiNER's,
sentence-transformers'), on one process: fetched one batch ahead as accelerate's `DataLoaderShard`
fetches it (by the training and evaluation loops' look-ahead, `data/look_ahead.py`), so a collator that
draws random numbers draws them in a transformers run's order, and resumed exactly (the checkpoint
keeps the batch in hand, which the resumed epoch trains first).

The subclass here is GLiNER's shape: a map-style dataset, the Trainer's `_get_train_sampler()` (or a
sampler of its own, which a resume cannot start mid-epoch), a collator drawing from `random` and
torch, a model with dropout, an evaluation every 2 steps. Beside transformers.Trainer in the same
process (tests/app/test_gliner.py runs GLiNER itself).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

import trainwright

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.dropout = nn.Linear(4, 1), nn.Dropout(0.3)

    def forward(self, x, labels=None):
        y = self.linear(self.dropout(x)).squeeze(-1)
        return {"loss": ((y - labels) ** 2).mean(), "logits": y}


def collate(rows: list) -> dict:
    """A batch scaled by a number from `random` and noise from torch (an augmentation)."""
    x = torch.stack([r[0] for r in rows]) * random.uniform(0.5, 1.5)
    return {"x": x + 0.1 * torch.randn_like(x), "labels": torch.stack([r[1] for r in rows])}


def data(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, generator=g), torch.randn((), generator=g)) for _ in range(n)]


def prepared(base: type, own_sampler: bool = False, workers: int = 0) -> type:
    class Prepared(base):  # type: ignore[misc, valid-type]
        def get_train_dataloader(self):
            if own_sampler:  # no set_start: a resume reads and drops the epoch's seen batches
                sampler = RandomSampler(self.train_dataset, generator=torch.Generator().manual_seed(1))
            else:
                sampler = self._get_train_sampler()
            loader = DataLoader(
                self.train_dataset, batch_size=4, sampler=sampler, collate_fn=collate, num_workers=workers
            )
            return self.accelerator.prepare(loader)

        def get_eval_dataloader(self, eval_dataset=None):
            dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
            loader = DataLoader(dataset, batch_size=4, sampler=SequentialSampler(dataset), collate_fn=collate)
            return self.accelerator.prepare(loader)

    return Prepared


def trainer(lib, out: str, own_sampler: bool = False, workers: int = 0):
    args = lib.TrainingArguments(
        output_dir=out,
        max_steps=4,
        per_device_train_batch_size=4,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        save_steps=2,
        report_to="none",
        use_cpu=True,
        seed=5,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    torch.manual_seed(0)
    return prepared(lib.Trainer, own_sampler, workers)(
        model=Dropped(), args=args, train_dataset=data(24, 0), eval_dataset=data(8, 1)
    )


def losses(t) -> list[float]:
    """Every logged training and evaluation loss, in order."""
    return [row.get("loss", row.get("eval_loss")) for row in t.state.log_history[:-1]]


def test_batches_and_random_numbers_come_in_transformers_order(tmp_path):
    upstream = trainer(transformers, str(tmp_path / "hf"))
    upstream.train()
    ours = trainer(trainwright, str(tmp_path / "tw"))
    ours.train()
    assert losses(ours) == pytest.approx(losses(upstream), rel=1e-6)
    assert sum("eval_loss" in row for row in ours.state.log_history) == 2  # the evaluations drew too


@pytest.mark.parametrize("own_sampler", [False, True], ids=["trainers_sampler", "own_sampler"])
def test_a_resume_continues_exactly(tmp_path, own_sampler):
    whole = trainer(trainwright, str(tmp_path / "whole"), own_sampler)
    whole.train()
    resumed = trainer(trainwright, str(tmp_path / "resumed"), own_sampler)
    resumed.train(resume_from_checkpoint=os.path.join(whole.args.output_dir, "checkpoint-2"))
    assert losses(resumed)[-3:] == losses(whole)[-3:]  # steps 3 and 4 and the evaluation at 4
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_checkpoint_keeps_the_batch_in_hand(tmp_path):
    t = trainer(trainwright, str(tmp_path / "out"))
    t.train()
    folder = os.path.join(t.args.output_dir, "checkpoint-2")
    stored = load_file(os.path.join(folder, "batch_in_hand.safetensors"))
    assert set(stored) == {"x", "labels"} and stored["x"].shape == (4, 4)
    # the batch itself, so no RNG state is captured before each fetch
    assert "look_ahead" not in torch.load(os.path.join(folder, "rng_state.pth"), weights_only=True)


def test_a_resume_whose_workers_cannot_draw_as_before_says_so(tmp_path, caplog):
    whole = trainer(trainwright, str(tmp_path / "whole"), workers=1)
    whole.train()
    resumed = trainer(trainwright, str(tmp_path / "resumed"), workers=1)
    with caplog.at_level("WARNING", logger="trainwright.distributed.accelerator"):
        resumed.train(resume_from_checkpoint=os.path.join(whole.args.output_dir, "checkpoint-2"))
    assert "1 worker(s)" in caplog.text and "not bit-exact" in caplog.text

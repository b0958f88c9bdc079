"""The runs of the look-ahead tests (test_look_ahead.py, tests/jobs/look_ahead_job.py): a model with
dropout trained on batches whose collator (or dataset) draws from the global RNG, evaluated every 2
steps and checkpointed every 2, built the same way for transformers.Trainer and trainwright's.

Cases (`CASES`):

- "mlm": BERT built offline, `DataCollatorForLanguageModeling` (masks drawn with torch's RNG; its
  batches are `BatchEncoding`s), trainwright's sampler (resumed by starting it mid-epoch);
- "random": an MLP, a collator scaling each batch by a number from `random`, accumulation 2, two epochs;
- "numpy": the same with numpy's global RNG, over an iterable dataset of its own state (resumed by
  restoring that state, taken after the batch in hand was fetched);
- "unstorable": the "random" collator's batches as a mapping of its own (a `UserDict`), which a
  checkpoint cannot hold weights-only: the run captures the RNG state before each fetch instead, and
  a resume fetches the batch in hand again;
- "unstorable-stream": the same over the iterable dataset (its state captured before each fetch too).
"""

from __future__ import annotations

import random
from collections import UserDict
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import IterableDataset

CASES = ("mlm", "random", "numpy", "unstorable", "unstorable-stream")
SAVE_STEPS = 2


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))

    def forward(self, x, labels=None):
        y = self.net(x).squeeze(-1)
        return {"loss": ((y - labels) ** 2).mean(), "logits": y}


class Stream(IterableDataset):
    """Rows read in order, the position its own state (`state_dict` / `load_state_dict`)."""

    def __init__(self, rows: list) -> None:
        self.rows, self.position = rows, 0

    def __iter__(self):
        while self.position < len(self.rows):
            self.position += 1
            yield self.rows[self.position - 1]
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


class Features(UserDict):
    """A batch as a mapping of the collator's own: no checkpoint can hold it weights-only."""


def _stacked(rows: list, scale: float) -> dict:
    x = torch.stack([r[0] for r in rows]) * scale
    return {"x": x, "labels": torch.stack([r[1] for r in rows])}


def random_collate(rows: list) -> dict:
    return _stacked(rows, random.uniform(0.5, 1.5))


def numpy_collate(rows: list) -> dict:
    return _stacked(rows, float(np.random.uniform(0.5, 1.5)))


def unstorable_collate(rows: list) -> Features:
    return Features(random_collate(rows))


def rows(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, generator=g), torch.randn((), generator=g)) for _ in range(n)]


def build(lib: Any, case: str, output_dir: str, tokenizer_dir: str | None = None, **extra: Any) -> Any:
    """The case's Trainer of `lib` (transformers or trainwright), writing into `output_dir`."""
    common = dict(
        output_dir=output_dir,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        save_steps=SAVE_STEPS,
        report_to="none",
        use_cpu=True,
        seed=5,
        disable_tqdm=True,
    )
    if case == "mlm":
        import transformers
        from kit import hf

        tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
        model = hf.bert("mlm", seed=0, dropout=0.1, max_position_embeddings=64, **hf.token_ids(tok))
        args = lib.TrainingArguments(
            max_steps=6, per_device_train_batch_size=8, per_device_eval_batch_size=8, **common, **extra
        )
        return lib.Trainer(
            model=model,
            args=args,
            train_dataset=hf.mlm_dataset(tok, 32),
            eval_dataset=hf.mlm_dataset(tok, 16, seed=1),
            data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm_probability=0.15),
        )
    collate = {"random": random_collate, "numpy": numpy_collate}.get(case, unstorable_collate)
    stream = case in ("numpy", "unstorable-stream")
    length = dict(max_steps=6) if stream else dict(num_train_epochs=2)
    args = lib.TrainingArguments(
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        remove_unused_columns=False,
        **length,
        **common,
        **extra,
    )
    torch.manual_seed(0)
    train = rows(24, 0)
    return lib.Trainer(
        model=Dropped(),
        args=args,
        train_dataset=Stream(train) if stream else train,
        eval_dataset=rows(8, 1),
        data_collator=collate,
    )


def logged(trainer: Any) -> list[tuple[int, str, float]]:
    """Every logged training and evaluation loss: (step, "loss" | "eval_loss", value)."""
    return [
        (row["step"], key, row[key])
        for row in trainer.state.log_history
        for key in ("loss", "eval_loss")
        if key in row
    ]

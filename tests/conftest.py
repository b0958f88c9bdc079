"""Shared test fixtures: small real models and datasets (nothing is downloaded)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch
from kit.models import DropoutMLP  # noqa: F401  (imported by tests as conftest.DropoutMLP)
from torch import nn
from torch.utils.data import Dataset

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)


class RegressionDataset(Dataset):
    """y = a*x + b + noise, items {"input_x", "labels"} (as upstream's test helper)."""

    def __init__(self, a: float = 2.0, b: float = 3.0, length: int = 64, seed: int = 42, label_names=None):
        rng = np.random.default_rng(seed)
        self.label_names = ["labels"] if label_names is None else label_names
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.ys = [
            a * self.x + b + rng.normal(scale=0.1, size=(length,)).astype(np.float32)
            for _ in self.label_names
        ]
        self.getitem_calls = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        self.getitem_calls += 1
        item = {name: y[i] for name, y in zip(self.label_names, self.ys)}
        item["input_x"] = self.x[i]
        return item


class RegressionModel(nn.Module):
    """y = a*x + b; returns (mse, y) with labels, (y,) without."""

    def __init__(self, a: float = 0.0, b: float = 0.0, double_output: bool = False):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(float(a)))
        self.b = nn.Parameter(torch.tensor(float(b)))
        self.double_output = double_output

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        if labels is None:
            return (y, y) if self.double_output else (y,)
        loss = nn.functional.mse_loss(y, labels)
        return (loss, y, y) if self.double_output else (loss, y)


class VectorDataset(Dataset):
    def __init__(self, n: int = 64, d: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d, generator=g)
        self.y = self.x.sum(-1) + 0.1 * torch.randn(n, generator=g)
        self.getitem_calls = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        self.getitem_calls += 1
        return {"x": self.x[i], "labels": self.y[i]}


class PaddedLM(Dataset):
    """Sequences with very different numbers of label tokens (the rest is -100)."""

    def __init__(self, n=8, seq=12, vocab=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)
        self.labels = self.ids.clone()
        for i in range(n):
            keep = 2 + (i * i * 3) % (seq - 2)  # 2..11 real targets, different per sample
            self.labels[i, keep:] = -100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def tiny_gpt2(vocab: int = 64, n_layer: int = 2, n_embd: int = 32, seed: int = 0, dropout: float = 0.0):
    """kit.hf's GPT-2 without a tokenizer: `vocab` ids, bos and eos 0."""
    pytest.importorskip("transformers")
    from kit import hf

    return hf.gpt2(
        seed,
        vocab_size=vocab,
        n_layer=n_layer,
        n_embd=n_embd,
        dropout=dropout,
        bos_token_id=0,
        eos_token_id=0,
    )


def tiny_t5():
    """A 1-layer T5 (vocabulary 32) that generates: pad 0, eos 1, decoder start 0."""
    pytest.importorskip("transformers")
    from kit import hf

    return hf.t5(0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


def regression_with_eval(trainer_class, args, length: int = 64, model=None, **kw):
    """`trainer_class` on `model` (a new RegressionModel) with train and eval sets of `length`
    RegressionDataset samples; `kw` goes to the trainer."""
    model = RegressionModel() if model is None else model
    train, evaluation = RegressionDataset(length=length), RegressionDataset(length=length)
    return trainer_class(model, args, train_dataset=train, eval_dataset=evaluation, **kw)


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.getLogger("trainwright").setLevel(logging.WARNING)
    yield


@pytest.fixture
def jobs():
    """Start tests/jobs/fault_job.py with a config (`jobs(cfg)`); every job still running is killed at the end."""
    from kit.faults import FaultJob

    started: list[FaultJob] = []

    def start(cfg: dict) -> FaultJob:
        job = FaultJob(cfg)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill()


@pytest.fixture
def make_args(tmp_path):
    from trainwright.args.training_args import TrainingArguments

    def make(**kw):
        kw.setdefault("output_dir", str(tmp_path / "out"))
        kw.setdefault("report_to", "none")
        kw.setdefault("disable_tqdm", True)
        kw.setdefault("save_strategy", "no")
        kw.setdefault("use_cpu", True)
        return TrainingArguments(**kw)

    return make

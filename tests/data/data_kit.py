"""Shared helpers of the trainwright.data tests (test_data_*.py): stand-in training arguments and
small datasets, mapped and iterable."""

from __future__ import annotations

import types

import torch
from torch.utils.data import Dataset, IterableDataset

CPU = torch.device("cpu")


def make_args(**overrides):
    """The TrainingArguments fields the samplers and dataloaders read, with their defaults."""
    values = dict(
        seed=42,
        data_seed=None,
        group_by_length=False,
        train_sampling_strategy="random",
        length_column_name="length",
        per_device_train_batch_size=4,
        dataloader_drop_last=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=True,
        dataloader_persistent_workers=False,
        dataloader_prefetch_factor=None,
    )
    values.update(overrides)
    return types.SimpleNamespace(**values)


class PlainDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict:
        return {"idx": idx}


class RangeStream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

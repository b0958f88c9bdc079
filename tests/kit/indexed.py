"""A map-style dataset of sample indices and a model that records them, for tests that check which
samples each process trained on (tests/data/test_accelerator_data.py and its job)."""

from __future__ import annotations

import torch

READS = [0]  # samples this process loaded (Indexed and the iterables that share the count)


def item(i: int) -> dict:
    """Sample `i`: its input is i, its label 0, and `idx` names it."""
    return {"x": torch.tensor([float(i)]), "labels": torch.tensor(0.0), "idx": torch.tensor(i)}


class Indexed(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        READS[0] += 1
        return item(i)


class Recorder(torch.nn.Module):
    """Records the sample indices of every training forward; predicts its input."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def forward(self, x, labels=None, idx=None):
        if self.training:
            self.seen.append(idx.tolist())
        out = x[:, 0] + self.w
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}

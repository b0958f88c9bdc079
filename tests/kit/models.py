"""Plain torch models the tests and the job scripts share (a job cannot import conftest: it sets torch
to one thread and changes environment variables on import)."""

from __future__ import annotations

from torch import nn


class DropoutMLP(nn.Module):
    """Small MLP with dropout (exercises RNG restore), returns a dict."""

    def __init__(self, d_in: int = 8, hidden: int = 16, p: float = 0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, 1))

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        result = {"logits": out}
        if labels is not None:
            result["loss"] = nn.functional.mse_loss(out, labels)
        return result

"""`lr_scheduler_type="greedy"`: transformers' GreedyLR, stepped with the evaluation metric.

GreedyLR (arXiv 2512.14527) divides the LR by `factor` after more than `patience` evaluations
that improved the metric and multiplies it by `factor` after more than `patience` that did not,
within `[min_lr, max_lr]`, with cooldown/warmup pauses after a change and a reset to the initial
LRs after `reset_start` reductions at the floor. Where transformers is installed its class is
used (`lr_scheduler_type="greedy"` then gives upstream's object); otherwise `GreedyLR` below, the
same rule (`tests/optim/test_schedules_greedy.py` steps both side by side). Its state is numbers, strings
and lists: `scheduler.pt` loads with `weights_only=True`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from torch.optim import Optimizer


def _per_group(value: float | list[float] | tuple[float, ...], groups: int, name: str) -> list[float]:
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ValueError(f"GreedyLR: expected {groups} {name}s (one per param group), got {len(value)}")
        return list(value)
    return [value] * groups


class _RollingMean:
    """Mean of the last `window_size` values (GreedyLR's `smooth=True`); state as upstream's."""

    def __init__(self, window_size: int) -> None:
        self.window_size, self.sum = window_size, 0.0
        self.values: list[float] = []

    def add(self, value: float) -> float:
        self.values.append(value)
        self.sum += value
        if len(self.values) > self.window_size:
            self.sum -= self.values.pop(0)
        return self.sum / len(self.values)

    def state_dict(self) -> dict[str, Any]:
        return {"window_size": self.window_size, "values": list(self.values), "sum": self.sum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window_size = state.get("window_size", self.window_size)
        self.values = list(state.get("values", []))
        self.sum = state.get("sum", 0.0)


_STATE_KEYS = (
    "factor", "min_lrs", "max_lrs", "patience", "verbose", "cooldown", "warmup", "cooldown_counter",
    "warmup_counter", "mode", "threshold", "threshold_mode", "best", "num_bad_epochs", "num_good_epochs",
    "eps", "last_epoch", "smooth", "window_size", "reset_start", "reset_start_original", "_last_lr",
    "_init_lrs",
)  # fmt: skip


class GreedyLR:
    """transformers' GreedyLR, for runs without transformers: `step(metrics)` after each evaluation.

    Arguments and defaults are upstream's: `mode="min"`, `factor=0.95` (< 1), `patience=10`,
    `threshold=1e-6`, `threshold_mode="abs"`, `cooldown=0`, `warmup=0`, `min_lr=1e-3`,
    `max_lr=1.0` (a value or one per param group), `eps=1e-8` (smaller LR changes are not made),
    `verbose=False`, `smooth=False` (a rolling mean of `window_size=50` metrics), `reset_start=500`.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.95,
        patience: int = 10,
        threshold: float = 1e-6,
        threshold_mode: str = "abs",
        cooldown: int = 0,
        warmup: int = 0,
        min_lr: float | list[float] = 1e-3,
        max_lr: float | list[float] = 1.0,
        eps: float = 1e-8,
        verbose: bool = False,
        smooth: bool = False,
        window_size: int = 50,
        reset_start: int = 500,
    ) -> None:
        if factor >= 1.0:
            raise ValueError(f"GreedyLR: factor must be < 1.0, got {factor}")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"GreedyLR: {type(optimizer).__name__} is not an Optimizer")
        if mode not in ("min", "max"):
            raise ValueError(f"GreedyLR: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"GreedyLR: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        groups = len(optimizer.param_groups)
        self.optimizer, self.mode, self.factor, self.patience = optimizer, mode, factor, patience
        self.threshold, self.threshold_mode, self.eps, self.verbose = threshold, threshold_mode, eps, verbose
        self.cooldown, self.warmup, self.cooldown_counter, self.warmup_counter = cooldown, warmup, 0, 0
        self.smooth, self.window_size = smooth, window_size
        self.reset_start = self.reset_start_original = reset_start
        self.min_lrs = _per_group(min_lr, groups, "min_lr")
        self.max_lrs = _per_group(max_lr, groups, "max_lr")
        self._init_lrs = [group["lr"] for group in optimizer.param_groups]
        self._last_lr = list(self._init_lrs)
        self.last_epoch = 0
        self.best = self._worst()
        self.num_bad_epochs = self.num_good_epochs = 0
        self._rolling: _RollingMean | None = _RollingMean(window_size) if smooth else None

    def _worst(self) -> float:
        return float("inf") if self.mode == "min" else float("-inf")

    def is_better(self, current: float, best: float) -> bool:
        """Whether `current` beats `best` by more than the threshold (relative or absolute)."""
        if self.mode == "min":
            bar = best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold
            return current < bar
        bar = best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold
        return current > bar

    def step(self, metrics: float, epoch: int | None = None) -> None:
        """Count the evaluation `metrics` as an improvement or not, and move the LR when due."""
        current = float(metrics)
        if self._rolling is not None:
            current = self._rolling.add(current)
        self.last_epoch = epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.cooldown_counter > 0 or self.warmup_counter > 0:
            if self.cooldown_counter > 0:
                self.cooldown_counter -= 1
            else:
                self.warmup_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        else:
            self._count(current)
            if self.num_good_epochs > self.patience:
                self._increase_lr(epoch)
                self.warmup_counter, self.num_good_epochs = self.warmup, 0
            elif self.num_bad_epochs > self.patience:
                self._reduce_lr(epoch)
                self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _count(self, current: float) -> None:
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
            self.num_good_epochs += 1
        else:
            self.num_bad_epochs += 1
            self.num_good_epochs = 0

    def _reduce_lr(self, epoch: int) -> None:
        at_floor = True
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                group["lr"] = new
                if self.verbose:
                    print(f"Epoch {epoch}: reducing learning rate of group {i} to {new:.4e}.")
            at_floor = at_floor and not group["lr"] > self.min_lrs[i]
        if at_floor:
            self.reset_start -= 1
            if self.reset_start <= 0:
                self._reset()

    def _increase_lr(self, epoch: int) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = min(old / self.factor, self.max_lrs[i])
            if new - old > self.eps:
                group["lr"] = new
                if self.verbose:
                    print(f"Epoch {epoch}: increasing learning rate of group {i} to {new:.4e}.")
        self.reset_start = self.reset_start_original

    def _reset(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._init_lrs):
            group["lr"] = lr
        self.best = self._worst()
        self.num_bad_epochs = self.num_good_epochs = self.cooldown_counter = self.warmup_counter = 0
        self.reset_start = self.reset_start_original
        if self.smooth:
            self._rolling = _RollingMean(self.window_size)
        if self.verbose:
            print("Scheduler reset to initial state.")

    def get_last_lr(self) -> list[float]:
        """The LRs after the last step."""
        return self._last_lr

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state (upstream's keys; the rolling window under `_streaming_avg`)."""
        state = {key: getattr(self, key) for key in _STATE_KEYS}
        if self.smooth and self._rolling is not None:
            state["_streaming_avg"] = self._rolling.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a `state_dict()` and put its last LRs back into the optimizer."""
        for key in _STATE_KEYS:
            setattr(self, key, state_dict.get(key, getattr(self, key)))
        if "_streaming_avg" in state_dict:
            if self._rolling is None:
                self._rolling = _RollingMean(self.window_size)
            self._rolling.load_state_dict(state_dict["_streaming_avg"])
        if "_last_lr" in state_dict:
            for group, lr in zip(self.optimizer.param_groups, self._last_lr):
                group["lr"] = lr


def greedy_lr_class() -> type:
    """transformers' `GreedyLR` where transformers is installed (upstream's class), else ours."""
    if importlib.util.find_spec("transformers") is not None:
        try:
            from transformers.optimization import GreedyLR as UpstreamGreedyLR
        except ImportError:  # a transformers older than GreedyLR (before 5.x)
            return GreedyLR
        return UpstreamGreedyLR  # type: ignore[no-any-return]
    return GreedyLR

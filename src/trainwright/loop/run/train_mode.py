"""Training mode before every micro-batch, as transformers' `training_step` sets it.

transformers calls `model.train()` (and a schedule-free optimizer's `train()`) at the start of every
training step, so a module left in evaluation mode anywhere in the tree (a `from_pretrained` model
inside a wrapper, a callback's or a loss's `eval()`) trains with dropout from the next step on.
`model.train()` walks the whole tree in Python (about 380 us for a 12-layer GPT-2), so `TrainMode`
calls it only when it would change something: when a module of the tree is not training, or, for a
tree holding a module whose own `train()` does more than set the flags, every time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from torch import nn

_training = attrgetter("training")


def _nothing() -> None:
    return None


def _flag_only_trains() -> tuple[Any, ...]:
    """The `train` methods that only set the `training` flags (transformers' acts only on a change)."""
    found: list[Any] = [nn.Module.train]
    modeling = sys.modules.get("transformers.modeling_utils")
    if modeling is not None:
        found.append(modeling.PreTrainedModel.train)
    return tuple(found)


def _modules_to_check(model: nn.Module) -> tuple[nn.Module, ...] | None:
    """The tree's modules, or None when one of them overrides `train()` with more than the flags."""
    plain = _flag_only_trains()
    modules = tuple(model.modules())
    if any(type(m).train not in plain for m in modules):
        return None
    return modules


class TrainMode:
    """One run's `model.train()` / `optimizer.train()` before each micro-batch (see the module doc)."""

    __slots__ = ("_model", "_modules", "_optimizer_train")

    def __init__(self, optimizer: Any = None) -> None:
        self._model: nn.Module | None = None
        self._modules: tuple[nn.Module, ...] | None = None
        train = getattr(optimizer, "train", None)  # looked up once: a miss costs ~0.5 us a step
        self._optimizer_train: Callable[[], Any] = train if callable(train) else _nothing

    def __call__(self, model: nn.Module) -> None:
        if model is not self._model:
            model.train()
            self._model, self._modules = model, _modules_to_check(model)
        elif self._modules is None:  # a module's own train() does more: called every time
            model.train()
        elif not all(map(_training, self._modules)):  # in C: no Python frame per module
            model.train()
            self._modules = _modules_to_check(model)  # read again: a module added since is checked too
        self._optimizer_train()

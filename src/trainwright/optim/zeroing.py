"""Gradients set to None between optimizer steps, at the cost of the assignments."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch.autograd import profiler


def grads_to_none(optimizer: Any) -> Callable[[], None]:
    """`optimizer.zero_grad(set_to_none=True)`, decided once for a run.

    torch's `Optimizer.zero_grad` opens a profiler range through the op dispatcher on every call
    (~6 us, 2% of a small model's step) whether or not a profiler records. For an optimizer that
    keeps torch's `zero_grad`, the returned call sets each parameter's `.grad` to None itself and
    calls torch's only while a profiler records (its range is then in the trace, as before). An
    optimizer with its own `zero_grad` (DeepSpeed's, LOMO's, a user's override, one set on the
    instance) keeps it.
    """
    own = partial(optimizer.zero_grad, set_to_none=True)
    if (
        not isinstance(optimizer, torch.optim.Optimizer)
        or type(optimizer).zero_grad is not torch.optim.Optimizer.zero_grad
        or "zero_grad" in vars(optimizer)  # replaced on the instance (a library's patch)
        or not hasattr(profiler, "_is_profiler_enabled")  # torch's own fast check, since 2.1
    ):
        return own

    def to_none() -> None:
        if profiler._is_profiler_enabled:
            own()
            return
        for group in optimizer.param_groups:  # read each time: add_param_group / load_state_dict
            for p in group["params"]:
                p.grad = None

    return to_none

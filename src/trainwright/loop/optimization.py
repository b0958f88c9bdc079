"""Creating the Trainer's optimizer and learning-rate schedule.

The Trainer's `create_optimizer` / `create_scheduler` call in here; the optimizer's class and
kwargs come from the Trainer's own `get_optimizer_cls_and_kwargs` (a static method upstream
projects override), so an override is used. This module never imports the loop's trainer.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from trainwright.args.training_args import TrainingArguments
from trainwright.optim.optimizers import build_optimizer, create_optimizer
from trainwright.optim.schedules import get_scheduler


def make_optimizer(
    model: nn.Module,
    args: TrainingArguments,
    optimizer_cls_and_kwargs: tuple[type, dict] | None,
    get_optimizer_cls_and_kwargs: Any,
) -> torch.optim.Optimizer:
    """AdamW (fused where supported) with no weight decay on biases and norm weights, or the
    Trainer's `optimizer_cls_and_kwargs`; `get_optimizer_cls_and_kwargs(args, model)` is the
    Trainer's (possibly overridden) static method."""
    if optimizer_cls_and_kwargs is not None:
        cls, kwargs = optimizer_cls_and_kwargs
        return build_optimizer(cls, kwargs, model, args.weight_decay)
    # through the Trainer's static method, so that a subclass's override is used (as upstream)
    return create_optimizer(model, args, get_optimizer_cls_and_kwargs(args, model))


def make_scheduler(args: TrainingArguments, optimizer: torch.optim.Optimizer, num_training_steps: int) -> Any:
    """The `lr_scheduler_type` schedule over `num_training_steps`, with the arguments' warmup."""
    return get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.get_warmup_steps(num_training_steps),
        num_training_steps=num_training_steps,
        # a dict since TrainingArguments.__post_init__
        scheduler_specific_kwargs=cast(dict[str, Any], args.lr_scheduler_kwargs) or {},
    )


def optimizer_group(optimizer: torch.optim.Optimizer | None, param: Any = None) -> Any:
    """The optimizer's parameter group holding `param`, or every group's parameters."""
    if optimizer is None:
        raise ValueError("The optimizer has not been created yet: call create_optimizer() or train() first.")
    if param is not None:
        for group in optimizer.param_groups:
            if any(p is param for p in group["params"]):
                return group
    return [group["params"] for group in optimizer.param_groups]

"""Optimizers (`optim=`), including optional packages' ones, and learning-rate schedules."""

from trainwright.optim.decay import decay_param_groups, get_decay_parameter_names
from trainwright.optim.optimizers import (
    build_optimizer,
    create_optimizer,
    get_optimizer_cls_and_kwargs,
    parse_optim_args,
)

__all__ = [
    "get_decay_parameter_names",
    "parse_optim_args",
    "get_optimizer_cls_and_kwargs",
    "decay_param_groups",
    "build_optimizer",
    "create_optimizer",
]

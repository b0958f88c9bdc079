"""Learning-rate schedules with the names and curves of `transformers.optimization`.

Every schedule except `reduce_lr_on_plateau` and `greedy` (stepped with the evaluation metric,
`steps_on_metric`) is a `LambdaLR` whose multiplier is a module-level
function bound with `functools.partial`. The scheduler state therefore holds only numbers and
empty dicts: it is written with `torch.save` and read back with `torch.load(weights_only=True)`.
The curve's parameters are not part of that state; they come from the arguments the schedule is
built with, so a resumed run gets the schedule it asks for and the step count it saved.

The multiplier at optimizer step `k` (0-based) is `f(k)`: the scheduler is built at `f(0)` and
each `scheduler.step()` moves to the next step.
"""

from __future__ import annotations

import inspect
import math
import numbers
import operator
import warnings
from collections.abc import Callable
from enum import Enum
from functools import partial
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from trainwright.optim.greedy import greedy_lr_class

_PHASE_SHAPES = ("linear", "cosine", "1-sqrt")


# -- resumable scheduler classes ------------------------------------------------------------------


class _PutsLearningRateBack:
    """After `load_state_dict`, write the restored LR into the optimizer's param groups.

    Without this the optimizer keeps the LR of step 0 (set when the fresh scheduler was built) until
    the next `scheduler.step()`, unless the optimizer state happens to be loaded after the scheduler
    was built; the first resumed step would then run at the wrong LR.
    """

    optimizer: Optimizer
    _last_lr: list[float | torch.Tensor]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # type: ignore[misc]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr


class _LambdaSchedule(_PutsLearningRateBack, LambdaLR):
    def step(self, epoch: int | None = None) -> None:
        """`LambdaLR.step`, the same rates and state: ``base_lr * f(step)`` written to each group.
        Float rates (the plain run) are set here, with a fifth of torch's Python work (a small
        model's step is ~2% faster); the first step (torch's order warnings), an explicit epoch and
        tensor rates (filled in place) go through torch's own."""
        groups, bases = self.optimizer.param_groups, self.base_lrs
        if epoch is not None or self._step_count == 1 or not _float_rates(groups, bases):
            return super().step(epoch)
        self._step_count += 1
        self.last_epoch = step = self.last_epoch + 1
        rates = [base * f(step) for f, base in zip(self.lr_lambdas, bases, strict=True)]
        for group, lr in zip(groups, rates, strict=True):
            group["lr"] = lr
        self._last_lr = rates


_RATE = operator.itemgetter("lr")


def _float_rates(groups: list[dict[str, Any]], bases: list[Any]) -> bool:
    """Whether every group's rate and base rate is a float (not a tensor torch fills in place);
    in C, no Python loop: it runs on every step."""
    return {*map(type, map(_RATE, groups)), *map(type, bases)} == _FLOAT_ONLY


_FLOAT_ONLY = {float}


class _PlateauSchedule(_PutsLearningRateBack, ReduceLROnPlateau):
    pass


def get_learning_rates(optimizer: Optimizer) -> list[float]:
    """The LR of each param group that the next `optimizer.step()` will use.

    Read it before `scheduler.step()` to log the LR actually applied at a step (reading it after
    gives the next step's LR, an off-by-one that matters for cyclic schedules).
    """
    return [float(group["lr"]) for group in optimizer.param_groups]


# -- argument checks ------------------------------------------------------------------------------


def _steps(value: Any, *, schedule: str, arg: str, minimum: int = 0) -> int:
    if value is None:
        raise ValueError(f"lr scheduler {schedule!r} needs {arg}; got None")
    whole = isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer()
    if not whole or value < minimum:
        hint = " (convert a warmup ratio to a number of steps first)" if isinstance(value, float) else ""
        raise ValueError(
            f"lr scheduler {schedule!r}: {arg} must be a whole number >= {minimum}{hint}; got {value!r}"
        )
    return int(value)


def _check_shape(value: str, *, schedule: str, arg: str) -> str:
    if value not in _PHASE_SHAPES:
        raise ValueError(
            f"lr scheduler {schedule!r}: {arg} must be one of {list(_PHASE_SHAPES)}; got {value!r}"
        )
    return value


def _min_lr_rate(
    optimizer: Optimizer, min_lr: float | None, min_lr_rate: float | None, schedule: str
) -> float:
    if (min_lr is None) == (min_lr_rate is None):
        raise ValueError(
            f"lr scheduler {schedule!r} needs exactly one of min_lr or min_lr_rate "
            f"(lr_scheduler_kwargs); got min_lr={min_lr!r}, min_lr_rate={min_lr_rate!r}"
        )
    if min_lr is not None:
        return min_lr / optimizer.defaults["lr"]
    assert min_lr_rate is not None  # exactly one of the two is set (checked above)
    return float(min_lr_rate)


def _bind(target: Callable[..., Any], schedule: str, *args: Any, **kwargs: Any) -> None:
    """Raise a ValueError naming the schedule if `target` cannot take these arguments."""
    try:
        inspect.signature(target).bind(*args, **kwargs)
    except TypeError as err:
        params = list(inspect.signature(target).parameters.values())[1:]  # after the optimizer
        accepted = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        raise ValueError(
            f"lr scheduler {schedule!r}: {err}; accepted keyword arguments: {accepted}"
        ) from None


# -- multipliers (functions of the 0-based optimizer step) -----------------------------------------


def _warmup(step: int, warmup: int) -> float:
    return step / max(1, warmup)


def _constant(step: int) -> float:
    return 1.0


def _constant_after_warmup(step: int, *, warmup: int) -> float:
    return _warmup(step, warmup) if step < warmup else 1.0


def _linear(step: int, *, warmup: int, total: int) -> float:
    if step < warmup:
        return _warmup(step, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def _cosine(step: int, *, warmup: int, total: int, cycles: float, floor: float = 0.0) -> float:
    if step < warmup:
        return _warmup(step, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    wave = 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * progress))
    return max(0.0, wave * (1.0 - floor) + floor)


def _cosine_restarts(step: int, *, warmup: int, total: int, cycles: int) -> float:
    if step < warmup:
        return _warmup(step, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(cycles) * progress) % 1.0))))


def _polynomial(step: int, *, warmup: int, total: int, lr_init: float, lr_end: float, power: float) -> float:
    # LambdaLR multiplies by the group's base LR, so the absolute curve is divided by lr_init.
    if step < warmup:
        return _warmup(step, warmup)
    if step > total or total == warmup:
        return lr_end / lr_init
    remaining = 1 - (step - warmup) / (total - warmup)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def _inverse_sqrt(step: int, *, warmup: int, timescale: int) -> float:
    if step < warmup:
        return _warmup(step, warmup)
    return 1.0 / math.sqrt((step + timescale - warmup) / timescale)


def _cosine_shifted(
    step: int, *, warmup: int, total: int, cycles: float, floor: float, warmup_lr_rate: float | None
) -> float:
    # Counts steps from 1: the first step already runs at 1/warmup (or at warmup_lr_rate).
    if step < warmup:
        if warmup_lr_rate is None:
            return (step + 1.0) / max(1.0, float(warmup))
        return warmup_lr_rate + (1.0 - warmup_lr_rate) * step / max(1, warmup - 1)
    progress = (step - warmup + 1.0) / max(1.0, float(total - warmup))
    wave = 0.5 * (1.0 + math.cos(math.pi * cycles * 2.0 * progress))
    return max(0.0, wave * (1.0 - floor) + floor)


def _warmup_stable_decay(
    step: int,
    *,
    warmup: int,
    stable: int,
    decay: int,
    warmup_type: str,
    decay_type: str,
    floor: float,
    cycles: float,
) -> float:
    if step < warmup:
        progress = float(step) / float(max(1, warmup))
        if warmup_type == "linear":
            rise = progress
        elif warmup_type == "cosine":
            rise = 0.5 * (1.0 - math.cos(math.pi * progress))
        else:
            rise = 1.0 - math.sqrt(1.0 - progress)
        return max(0.0, rise * (1.0 - floor) + floor)
    if step < warmup + stable:
        return 1.0
    if step < warmup + stable + decay:
        progress = float(step - warmup - stable) / float(max(1, decay))
        if decay_type == "linear":
            fall = 1.0 - progress
        elif decay_type == "cosine":
            fall = 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * progress))
        else:
            fall = 1.0 - math.sqrt(progress)
        return max(0.0, fall * (1.0 - floor) + floor)
    return floor


# -- named constructors (transformers' names and signatures) ---------------------------------------


def get_constant_schedule(optimizer: Optimizer, last_epoch: int = -1) -> LambdaLR:
    """Keep the optimizer's LR for the whole run."""
    return _LambdaSchedule(optimizer, _constant, last_epoch=last_epoch)


def get_constant_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Rise linearly from 0 to the optimizer's LR over `num_warmup_steps`, then stay there."""
    warmup = _steps(num_warmup_steps, schedule="constant_with_warmup", arg="num_warmup_steps")
    return _LambdaSchedule(optimizer, partial(_constant_after_warmup, warmup=warmup), last_epoch=last_epoch)


def get_linear_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup from 0, then linear decay to 0 at `num_training_steps`."""
    warmup = _steps(num_warmup_steps, schedule="linear", arg="num_warmup_steps")
    total = _steps(num_training_steps, schedule="linear", arg="num_training_steps")
    return _LambdaSchedule(optimizer, partial(_linear, warmup=warmup, total=total), last_epoch=last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then a cosine wave with `num_cycles` periods (0.5: one half-cosine down to 0)."""
    warmup = _steps(num_warmup_steps, schedule="cosine", arg="num_warmup_steps")
    total = _steps(num_training_steps, schedule="cosine", arg="num_training_steps")
    curve = partial(_cosine, warmup=warmup, total=total, cycles=num_cycles)
    return _LambdaSchedule(optimizer, curve, last_epoch=last_epoch)


def get_cosine_with_hard_restarts_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: int = 1,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then `num_cycles` half-cosines, each jumping back to the full LR."""
    warmup = _steps(num_warmup_steps, schedule="cosine_with_restarts", arg="num_warmup_steps")
    total = _steps(num_training_steps, schedule="cosine_with_restarts", arg="num_training_steps")
    curve = partial(_cosine_restarts, warmup=warmup, total=total, cycles=num_cycles)
    return _LambdaSchedule(optimizer, curve, last_epoch=last_epoch)


def get_polynomial_decay_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float = 1e-7,
    power: float = 1.0,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then `(lr - lr_end) * remaining**power + lr_end`, with `lr` the optimizer default."""
    warmup = _steps(num_warmup_steps, schedule="polynomial", arg="num_warmup_steps")
    total = _steps(num_training_steps, schedule="polynomial", arg="num_training_steps")
    lr_init = optimizer.defaults["lr"]
    if not lr_init > lr_end:
        raise ValueError(
            f"lr scheduler 'polynomial': lr_end ({lr_end}) must be smaller than the initial lr ({lr_init})"
        )
    curve = partial(_polynomial, warmup=warmup, total=total, lr_init=lr_init, lr_end=lr_end, power=power)
    return _LambdaSchedule(optimizer, curve, last_epoch=last_epoch)


def get_inverse_sqrt_schedule(
    optimizer: Optimizer, num_warmup_steps: int, timescale: int | None = None, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then `1 / sqrt((step + timescale - warmup) / timescale)`.

    `timescale` defaults to `num_warmup_steps`, or 10,000 without warmup.
    """
    warmup = _steps(num_warmup_steps, schedule="inverse_sqrt", arg="num_warmup_steps")
    if timescale is None:
        scale = warmup or 10_000
    else:
        scale = _steps(timescale, schedule="inverse_sqrt", arg="timescale", minimum=1)
    curve = partial(_inverse_sqrt, warmup=warmup, timescale=scale)
    return _LambdaSchedule(optimizer, curve, last_epoch=last_epoch)


def get_reduce_on_plateau_schedule(optimizer: Optimizer, **kwargs: Any) -> ReduceLROnPlateau:
    """torch's `ReduceLROnPlateau` (kwargs go to it); step it with the evaluation metric."""
    _bind(ReduceLROnPlateau, "reduce_lr_on_plateau", optimizer, **kwargs)
    return _PlateauSchedule(optimizer, **kwargs)


def get_greedy_schedule(optimizer: Optimizer, **kwargs: Any) -> Any:
    """transformers' `GreedyLR` (kwargs go to it; `trainwright.optim.greedy`); step it with the
    evaluation metric."""
    cls = greedy_lr_class()
    _bind(cls, "greedy", optimizer, **kwargs)
    return cls(optimizer, **kwargs)


def steps_on_metric(scheduler: Any) -> bool:
    """Whether `scheduler` is stepped with the evaluation metric instead of after each optimizer step.

    True for `ReduceLROnPlateau`, `GreedyLR` and any scheduler whose `step` takes the metric: its
    first parameter is named `metrics` or has no default (it cannot be stepped without a value).
    """
    if scheduler is None:
        return False
    if isinstance(scheduler, ReduceLROnPlateau):
        return True
    try:
        params = list(inspect.signature(scheduler.step).parameters.values())
    except (AttributeError, TypeError, ValueError):  # no step, or one without a signature (C function)
        return False
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return False
    return params[0].name == "metrics" or params[0].default is inspect.Parameter.empty


def get_cosine_with_min_lr_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
) -> LambdaLR:
    """Like the cosine schedule, but the wave ends at `min_lr` (or `min_lr_rate` times the LR) instead of 0."""
    warmup = _steps(num_warmup_steps, schedule="cosine_with_min_lr", arg="num_warmup_steps")
    total = _steps(num_training_steps, schedule="cosine_with_min_lr", arg="num_training_steps")
    floor = _min_lr_rate(optimizer, min_lr, min_lr_rate, "cosine_with_min_lr")
    curve = partial(_cosine, warmup=warmup, total=total, cycles=num_cycles, floor=floor)
    return _LambdaSchedule(optimizer, curve, last_epoch=last_epoch)


def get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
    warmup_lr_rate: float | None = None,
) -> LambdaLR:
    """The `cosine_warmup_with_min_lr` schedule: cosine to a floor, counting steps from 1.

    Warmup starts at `1/num_warmup_steps` (or at `warmup_lr_rate`) rather than 0.
    """
    warmup = _steps(num_warmup_steps, schedule="cosine_warmup_with_min_lr", arg="num_warmup_steps")
    total = _steps(num_training_steps, schedule="cosine_warmup_with_min_lr", arg="num_training_steps")
    floor = _min_lr_rate(optimizer, min_lr, min_lr_rate, "cosine_warmup_with_min_lr")
    start = None if warmup_lr_rate is None else float(warmup_lr_rate)
    curve = partial(
        _cosine_shifted,
        warmup=warmup,
        total=total,
        cycles=float(num_cycles),
        floor=floor,
        warmup_lr_rate=start,
    )
    return _LambdaSchedule(optimizer, curve, last_epoch=last_epoch)


def get_wsd_schedule(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_decay_steps: int,
    num_training_steps: int | None = None,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Warmup-stable-decay: rise to the LR, hold it, then fall to `min_lr_ratio` times the LR.

    The stable phase lasts `num_stable_steps`, or whatever `num_training_steps` leaves after warmup
    and decay. Warmup and decay shapes: "linear", "cosine" or "1-sqrt".
    """
    name = "warmup_stable_decay"
    warmup = _steps(num_warmup_steps, schedule=name, arg="num_warmup_steps")
    decay = _steps(num_decay_steps, schedule=name, arg="num_decay_steps")
    _check_shape(warmup_type, schedule=name, arg="warmup_type")
    _check_shape(decay_type, schedule=name, arg="decay_type")
    if num_stable_steps is None:
        if num_training_steps is None:
            raise ValueError(
                f"lr scheduler {name!r} needs num_training_steps or num_stable_steps; got neither"
            )
        total = _steps(num_training_steps, schedule=name, arg="num_training_steps")
        if warmup + decay > total:
            raise ValueError(
                f"lr scheduler {name!r}: num_warmup_steps + num_decay_steps ({warmup} + {decay}) "
                f"exceeds num_training_steps ({total})"
            )
        stable = total - warmup - decay
    else:
        stable = _steps(num_stable_steps, schedule=name, arg="num_stable_steps")
        if num_training_steps is not None and warmup + stable + decay != num_training_steps:
            warnings.warn(
                f"{name}: warmup + stable + decay = {warmup + stable + decay} steps but num_training_steps is "
                f"{num_training_steps}; steps past the decay stay at min_lr_ratio",
                stacklevel=2,
            )
    curve = partial(
        _warmup_stable_decay,
        warmup=warmup,
        stable=stable,
        decay=decay,
        warmup_type=warmup_type,
        decay_type=decay_type,
        floor=float(min_lr_ratio),
        cycles=num_cycles,
    )
    return _LambdaSchedule(optimizer, curve, last_epoch=last_epoch)


# -- by name ----------------------------------------------------------------------------------------

# name -> (constructor, which of get_scheduler's step counts it takes)
_BY_NAME: dict[str, tuple[Callable[..., LRScheduler], tuple[str, ...]]] = {
    "linear": (get_linear_schedule_with_warmup, ("num_warmup_steps", "num_training_steps")),
    "cosine": (get_cosine_schedule_with_warmup, ("num_warmup_steps", "num_training_steps")),
    "cosine_with_restarts": (
        get_cosine_with_hard_restarts_schedule_with_warmup,
        ("num_warmup_steps", "num_training_steps"),
    ),
    "polynomial": (get_polynomial_decay_schedule_with_warmup, ("num_warmup_steps", "num_training_steps")),
    "constant": (get_constant_schedule, ()),
    "constant_with_warmup": (get_constant_schedule_with_warmup, ("num_warmup_steps",)),
    "inverse_sqrt": (get_inverse_sqrt_schedule, ("num_warmup_steps",)),
    "reduce_lr_on_plateau": (get_reduce_on_plateau_schedule, ()),
    "cosine_with_min_lr": (
        get_cosine_with_min_lr_schedule_with_warmup,
        ("num_warmup_steps", "num_training_steps"),
    ),
    "cosine_warmup_with_min_lr": (
        get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
        ("num_warmup_steps", "num_training_steps"),
    ),
    "warmup_stable_decay": (get_wsd_schedule, ("num_warmup_steps", "num_training_steps")),
    "greedy": (get_greedy_schedule, ()),
}
SCHEDULER_NAMES: tuple[str, ...] = tuple(_BY_NAME)


def scheduler_name(name: str | Enum) -> str:
    """Normalise a scheduler name (plain string or str-enum member); unknown names raise ValueError."""
    value = name.value if isinstance(name, Enum) else name
    if value not in _BY_NAME:
        raise ValueError(f"unknown lr_scheduler_type {value!r}; choose one of {list(SCHEDULER_NAMES)}")
    return value


def get_scheduler(
    name: str | Enum,
    optimizer: Optimizer,
    num_warmup_steps: int | None = None,
    num_training_steps: int | None = None,
    scheduler_specific_kwargs: dict[str, Any] | None = None,
) -> LRScheduler:
    """Build the schedule called `name` (see `SCHEDULER_NAMES`).

    `constant`, `reduce_lr_on_plateau` and `greedy` ignore the step counts; `constant_with_warmup` and
    `inverse_sqrt` need `num_warmup_steps`; `warmup_stable_decay` needs `num_warmup_steps`, and
    `num_decay_steps` plus `num_training_steps` or `num_stable_steps`; the rest need both counts.
    `scheduler_specific_kwargs` (`lr_scheduler_kwargs`) go to the named constructor; one it does
    not take is an error, not silently dropped.
    """
    key = scheduler_name(name)
    build, takes = _BY_NAME[key]
    extra = dict(scheduler_specific_kwargs or {})
    given = {"num_warmup_steps": num_warmup_steps, "num_training_steps": num_training_steps}
    doubled = sorted(set(extra) & set(given))
    if doubled:
        raise ValueError(
            f"lr scheduler {key!r}: pass {doubled} as arguments of get_scheduler, not in scheduler_specific_kwargs"
        )
    counts = {arg: given[arg] for arg in takes}
    _bind(build, key, optimizer, **counts, **extra)
    return build(optimizer, **counts, **extra)

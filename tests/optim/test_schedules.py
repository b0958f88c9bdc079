"""Learning-rate schedules: exact curves, transformers parity, resumable state, argument errors."""

from __future__ import annotations

import math
from enum import Enum

import pytest
import torch
from optim_kit import PARITY_CASES

from trainwright.optim import schedules
from trainwright.optim.schedules import SCHEDULER_NAMES, get_learning_rates, get_scheduler

WARMUP, TOTAL = 10, 100


def _optimizer(lr: float = 0.1, second_lr: float | None = 0.03) -> torch.optim.Optimizer:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))]}]
    if second_lr is not None:  # a group with its own LR: the multiplier applies to each group's base LR
        groups.append({"params": [torch.nn.Parameter(torch.zeros(2))], "lr": second_lr})
    return torch.optim.SGD(groups, lr=lr)


def _run(optimizer: torch.optim.Optimizer, scheduler, steps: int) -> list[list[float]]:
    """LR of every group at each optimizer step (read before the step, as the trainer logs it)."""
    seen = []
    for _ in range(steps):
        seen.append(get_learning_rates(optimizer))
        optimizer.step()
        scheduler.step()
    return seen


def _close(ours: list[list[float]], theirs: list[list[float]]) -> None:
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-18), f"step {step}"


@pytest.mark.parametrize("warmup", [WARMUP, 0])
@pytest.mark.parametrize(
    ("name", "kwargs"), PARITY_CASES, ids=lambda v: str(v) if isinstance(v, str) else None
)
def test_curve_matches_transformers(name: str, kwargs: dict, warmup: int) -> None:
    optimization = pytest.importorskip("transformers.optimization")
    steps = TOTAL + 15  # run past the end of training: what happens there is part of the curve
    ours_opt, theirs_opt = _optimizer(), _optimizer()
    ours = get_scheduler(name, ours_opt, warmup, TOTAL, dict(kwargs))
    theirs = optimization.get_scheduler(name, theirs_opt, warmup, TOTAL, dict(kwargs))
    _close(_run(ours_opt, ours, steps), _run(theirs_opt, theirs, steps))


def test_plateau_matches_transformers() -> None:
    optimization = pytest.importorskip("transformers.optimization")
    metrics = [1.0, 0.9, 0.95, 0.97, 0.99, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]
    runs = []
    for module in (schedules, optimization):
        optimizer = _optimizer()
        scheduler = module.get_scheduler(
            "reduce_lr_on_plateau", optimizer, scheduler_specific_kwargs={"patience": 1}
        )
        seen = []
        for metric in metrics:
            seen.append(get_learning_rates(optimizer))
            scheduler.step(metric)
        runs.append(seen)
    _close(*runs)
    assert runs[0][-1][0] < 0.1  # the metric stalled, so the LR did go down


# name, kwargs, warmup, total, {step: multiplier of the base LR}, worked out by hand
EXACT_CASES = [
    ("linear", {}, 10, 100, {0: 0.0, 5: 0.5, 10: 1.0, 55: 0.5, 100: 0.0, 107: 0.0}),
    ("cosine", {}, 10, 100, {0: 0.0, 5: 0.5, 10: 1.0, 55: 0.5, 100: 0.0}),
    ("cosine", {"num_cycles": 1.0}, 10, 110, {35: 0.5, 60: 0.0, 110: 1.0}),
    (
        "cosine_with_restarts",
        {"num_cycles": 2},
        10,
        110,
        {10: 1.0, 35: 0.5, 59: None, 60: 1.0, 85: 0.5, 110: 0.0},
    ),
    ("polynomial", {"lr_end": 0.0, "power": 2.0}, 10, 100, {5: 0.5, 10: 1.0, 55: 0.25, 100: 0.0, 120: 0.0}),
    ("polynomial", {"lr_end": 0.01}, 10, 100, {55: 0.505, 100: 0.01, 150: 0.01}),
    ("constant", {}, 10, 100, {0: 1.0, 5: 1.0, 100: 1.0}),
    ("constant_with_warmup", {}, 10, 100, {0: 0.0, 5: 0.5, 10: 1.0, 500: 1.0}),
    ("inverse_sqrt", {}, 10, 100, {5: 0.5, 10: 1.0, 40: 0.5, 160: 0.25}),
    ("inverse_sqrt", {"timescale": 10}, 0, 100, {0: 1.0, 30: 0.5}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.2}, 10, 100, {5: 0.5, 10: 1.0, 55: 0.6, 100: 0.2}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.2}, 10, 110, {0: 0.1, 9: 1.0, 59: 0.6, 109: 0.2}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.0, "warmup_lr_rate": 0.1}, 10, 110, {0: 0.1, 9: 1.0}),
    (
        "warmup_stable_decay",
        {"num_decay_steps": 20, "decay_type": "linear", "min_lr_ratio": 0.1},
        10,
        100,
        {0: 0.1, 5: 0.55, 10: 1.0, 79: 1.0, 80: 1.0, 90: 0.55, 100: 0.1, 130: 0.1},
    ),
    (
        "warmup_stable_decay",
        {"num_decay_steps": 20, "warmup_type": "cosine"},
        10,
        100,
        {5: 0.5, 90: 0.5, 100: 0.0},
    ),
    (
        "warmup_stable_decay",
        {"num_decay_steps": 20, "decay_type": "1-sqrt"},
        10,
        100,
        {85: 0.5, 99: 1 - math.sqrt(0.95)},
    ),
]


@pytest.mark.parametrize(("name", "kwargs", "warmup", "total", "expected"), EXACT_CASES)
def test_exact_multipliers(name: str, kwargs: dict, warmup: int, total: int, expected: dict) -> None:
    optimizer = _optimizer(lr=1.0, second_lr=0.5)
    scheduler = get_scheduler(name, optimizer, warmup, total, kwargs)
    for step in range(max(expected) + 1):
        if expected.get(step) is not None:
            base, second = get_learning_rates(optimizer)
            assert base == pytest.approx(expected[step], rel=1e-12, abs=1e-15), f"step {step}"
            assert second == pytest.approx(0.5 * expected[step], rel=1e-12, abs=1e-15), f"step {step}"
        optimizer.step()
        scheduler.step()


def test_learning_rate_read_before_the_step_is_the_applied_one() -> None:
    # SGD without momentum moves the parameter by exactly lr * grad, so the applied LR is observable.
    param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=4, num_training_steps=8)
    for _ in range(8):
        (logged,) = get_learning_rates(optimizer)
        before = param.item()
        param.grad = torch.ones_like(param)
        optimizer.step()
        scheduler.step()
        assert before - param.item() == pytest.approx(logged, abs=1e-15)


@pytest.mark.parametrize(
    ("name", "kwargs"), PARITY_CASES, ids=lambda v: str(v) if isinstance(v, str) else None
)
def test_state_round_trip_with_weights_only(tmp_path, name: str, kwargs: dict) -> None:
    reference_opt = _optimizer()
    reference = get_scheduler(name, reference_opt, WARMUP, TOTAL, dict(kwargs))
    expected = _run(reference_opt, reference, TOTAL + 5)

    optimizer = _optimizer()
    scheduler = get_scheduler(name, optimizer, WARMUP, TOTAL, dict(kwargs))
    first = _run(optimizer, scheduler, 37)
    torch.save(scheduler.state_dict(), tmp_path / "scheduler.pt")
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")

    resumed_opt = _optimizer()
    resumed = get_scheduler(name, resumed_opt, WARMUP, TOTAL, dict(kwargs))
    resumed_opt.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    resumed.load_state_dict(torch.load(tmp_path / "scheduler.pt", weights_only=True))
    assert first + _run(resumed_opt, resumed, TOTAL + 5 - 37) == expected


def test_loading_scheduler_state_restores_the_optimizer_lr(tmp_path) -> None:
    # Only the scheduler state is loaded: the first resumed step must still use the saved LR,
    # not the LR of step 0 that the fresh scheduler set.
    optimizer = _optimizer()
    scheduler = get_scheduler("cosine", optimizer, WARMUP, TOTAL)
    _run(optimizer, scheduler, 42)
    saved_lrs = get_learning_rates(optimizer)
    torch.save(scheduler.state_dict(), tmp_path / "scheduler.pt")

    fresh_opt = _optimizer()
    fresh = get_scheduler("cosine", fresh_opt, WARMUP, TOTAL)
    assert get_learning_rates(fresh_opt) == [0.0, 0.0]
    fresh.load_state_dict(torch.load(tmp_path / "scheduler.pt", weights_only=True))
    assert get_learning_rates(fresh_opt) == saved_lrs
    assert fresh.last_epoch == 42


def test_plateau_state_round_trip_with_weights_only(tmp_path) -> None:
    metrics = [1.0, 0.9, 0.95, 0.97, 0.99, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3]

    def drive(optimizer, scheduler, values):
        seen = []
        for metric in values:
            seen.append(get_learning_rates(optimizer))
            scheduler.step(metric)
        return seen

    ref_opt = _optimizer()
    expected = drive(
        ref_opt,
        get_scheduler("reduce_lr_on_plateau", ref_opt, scheduler_specific_kwargs={"patience": 1}),
        metrics,
    )
    optimizer = _optimizer()
    scheduler = get_scheduler("reduce_lr_on_plateau", optimizer, scheduler_specific_kwargs={"patience": 1})
    first = drive(optimizer, scheduler, metrics[:7])
    torch.save(scheduler.state_dict(), tmp_path / "scheduler.pt")

    fresh_opt = _optimizer()
    fresh = get_scheduler("reduce_lr_on_plateau", fresh_opt, scheduler_specific_kwargs={"patience": 1})
    fresh.load_state_dict(torch.load(tmp_path / "scheduler.pt", weights_only=True))
    assert first + drive(fresh_opt, fresh, metrics[7:]) == expected
    assert expected[-1][0] < expected[0][0]


def test_names_accept_str_enums_and_list_the_choices() -> None:
    class SchedulerType(str, Enum):
        COSINE = "cosine"

    optimizer = _optimizer()
    assert isinstance(
        get_scheduler(SchedulerType.COSINE, optimizer, 1, 10), torch.optim.lr_scheduler.LambdaLR
    )
    transformers_utils = pytest.importorskip("transformers.trainer_utils")
    get_scheduler(transformers_utils.SchedulerType.LINEAR, optimizer, 1, 10)

    with pytest.raises(ValueError, match="unknown lr_scheduler_type 'cosinus'") as info:
        get_scheduler("cosinus", optimizer, 1, 10)
    for name in SCHEDULER_NAMES:
        assert repr(name) in str(info.value)


NEEDS_TRAINING_STEPS = [
    ("linear", {}),
    ("cosine", {}),
    ("cosine_with_restarts", {}),
    ("polynomial", {}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
]


@pytest.mark.parametrize(("name", "kwargs"), NEEDS_TRAINING_STEPS)
def test_missing_step_counts_name_the_schedule_and_argument(name: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=rf"'{name}' needs num_training_steps"):
        get_scheduler(name, _optimizer(), num_warmup_steps=5, scheduler_specific_kwargs=kwargs)
    with pytest.raises(ValueError, match=rf"'{name}' needs num_warmup_steps"):
        get_scheduler(name, _optimizer(), num_training_steps=50, scheduler_specific_kwargs=kwargs)


def test_schedules_that_need_fewer_step_counts() -> None:
    optimizer = _optimizer()
    get_scheduler("constant", optimizer)
    get_scheduler("reduce_lr_on_plateau", optimizer)
    get_scheduler("inverse_sqrt", optimizer, num_warmup_steps=5)
    # without warmup the timescale defaults to 10,000 steps
    assert get_scheduler("inverse_sqrt", optimizer, num_warmup_steps=0).lr_lambdas[0](30_000) == 0.5
    get_scheduler("constant_with_warmup", optimizer, num_warmup_steps=5)
    for name in ("inverse_sqrt", "constant_with_warmup"):
        with pytest.raises(ValueError, match=rf"'{name}' needs num_warmup_steps"):
            get_scheduler(name, optimizer, num_training_steps=50)
    wsd = "warmup_stable_decay"
    with pytest.raises(ValueError, match=rf"'{wsd}'.*num_decay_steps"):
        get_scheduler(wsd, optimizer, 5, 50)
    with pytest.raises(ValueError, match=rf"'{wsd}' needs num_training_steps or num_stable_steps"):
        get_scheduler(wsd, optimizer, 5, scheduler_specific_kwargs={"num_decay_steps": 10})
    scheduler = get_scheduler(
        wsd, optimizer, 5, scheduler_specific_kwargs={"num_decay_steps": 10, "num_stable_steps": 20}
    )
    assert scheduler.lr_lambdas[0](25) == 1.0 and scheduler.lr_lambdas[0](35) == 0.0


def test_bad_arguments_are_rejected_with_clear_errors() -> None:
    optimizer = _optimizer()
    with pytest.raises(ValueError, match=r"'linear'.*num_warmup_steps must be a whole number.*warmup ratio"):
        get_scheduler("linear", optimizer, num_warmup_steps=0.1, num_training_steps=100)
    with pytest.raises(ValueError, match=r"'cosine'.*num_training_steps must be a whole number >= 0; got -3"):
        get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=-3)
    assert (
        get_scheduler("linear", optimizer, num_warmup_steps=10.0, num_training_steps=100).lr_lambdas[0](5)
        == 0.5
    )
    with pytest.raises(ValueError, match=r"'cosine'.*unexpected keyword argument 'min_lr'.*num_cycles"):
        get_scheduler("cosine", optimizer, 1, 10, {"min_lr": 0.1})
    with pytest.raises(ValueError, match=r"'constant'.*unexpected keyword argument 'num_cycles'"):
        get_scheduler("constant", optimizer, scheduler_specific_kwargs={"num_cycles": 2})
    with pytest.raises(ValueError, match=r"'reduce_lr_on_plateau'.*'patients'.*patience"):
        get_scheduler("reduce_lr_on_plateau", optimizer, scheduler_specific_kwargs={"patients": 2})
    with pytest.raises(ValueError, match=r"pass \['num_training_steps'\] as arguments of get_scheduler"):
        get_scheduler("linear", optimizer, 1, 10, {"num_training_steps": 20})
    with pytest.raises(ValueError, match=r"lr_end \(0.5\) must be smaller than the initial lr \(0.1\)"):
        get_scheduler("polynomial", optimizer, 1, 10, {"lr_end": 0.5})
    for bad in ({}, {"min_lr": 0.01, "min_lr_rate": 0.1}):
        with pytest.raises(
            ValueError, match="'cosine_with_min_lr' needs exactly one of min_lr or min_lr_rate"
        ):
            get_scheduler("cosine_with_min_lr", optimizer, 1, 10, bad)
    with pytest.raises(
        ValueError, match=r"decay_type must be one of \['linear', 'cosine', '1-sqrt'\]; got 'exp'"
    ):
        get_scheduler("warmup_stable_decay", optimizer, 1, 10, {"num_decay_steps": 5, "decay_type": "exp"})
    with pytest.raises(
        ValueError,
        match=r"num_warmup_steps \+ num_decay_steps \(10 \+ 95\) exceeds num_training_steps \(100\)",
    ):
        get_scheduler("warmup_stable_decay", optimizer, 10, 100, {"num_decay_steps": 95})
    with pytest.raises(ValueError, match="timescale must be a whole number >= 1"):
        get_scheduler("inverse_sqrt", optimizer, 10, scheduler_specific_kwargs={"timescale": 0})


def test_wsd_warns_when_explicit_phases_do_not_add_up() -> None:
    with pytest.warns(
        UserWarning, match="warmup \\+ stable \\+ decay = 80 steps but num_training_steps is 100"
    ):
        get_scheduler(
            "warmup_stable_decay", _optimizer(), 10, 100, {"num_decay_steps": 30, "num_stable_steps": 40}
        )


def test_named_constructors_use_transformers_signatures() -> None:
    optimizer = _optimizer()
    schedules.get_cosine_schedule_with_warmup(optimizer, 10, 100, 0.5, -1)
    schedules.get_polynomial_decay_schedule_with_warmup(optimizer, 10, 100, 1e-7, 1.0, -1)
    schedules.get_wsd_schedule(optimizer, 10, 20, 100)
    schedules.get_inverse_sqrt_schedule(optimizer, 10, None, -1)
    scheduler = schedules.get_cosine_with_hard_restarts_schedule_with_warmup(optimizer, 10, 100, num_cycles=2)
    assert scheduler.lr_lambdas[0](55) == 1.0


def test_names_agree_with_the_scheduler_type_enum() -> None:
    from trainwright.core.enums import SchedulerType

    assert SchedulerType.values() == list(SCHEDULER_NAMES)
    optimizer = _optimizer()
    assert get_scheduler(SchedulerType.COSINE_WITH_RESTARTS, optimizer, 1, 10).lr_lambdas[0](1) == 1.0

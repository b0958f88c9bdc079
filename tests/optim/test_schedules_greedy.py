"""lr_scheduler_type="greedy" (transformers' GreedyLR) and schedulers stepped with the eval metric.

Upstream: tests/trainer/test_trainer_optimizers.py `test_greedy_lr`, `test_greedy_lr_args`,
`test_reduce_lr_on_plateau_args`; tests/optimization/test_optimization.py's GreedyLR tests.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import RegressionModel, regression_with_eval
from torch import nn

from trainwright import Trainer
from trainwright.optim import greedy as ours
from trainwright.optim.schedules import get_scheduler, steps_on_metric

transformers = pytest.importorskip("transformers")
from transformers.optimization import GreedyLR as Upstream  # noqa: E402

METRICS = [1.0, 0.9, 0.8, 0.7, 0.75, 0.76, 0.77, 0.78, 0.6, 0.5, 0.4, 0.3, 0.35, 0.36, 0.37, 0.38, 0.39]


def _optimizer() -> torch.optim.Optimizer:
    weight, bias = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1))
    return torch.optim.SGD([{"params": [weight]}, {"params": [bias], "lr": 0.02}], lr=0.1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"patience": 1, "factor": 0.5, "min_lr": 1e-4},
        {"patience": 0, "factor": 0.8, "cooldown": 2, "warmup": 1, "min_lr": [1e-3, 1e-4], "max_lr": 0.15},
        {"mode": "max", "patience": 1, "threshold": 0.01, "threshold_mode": "rel", "min_lr": 0.0},
        {"patience": 0, "smooth": True, "window_size": 3, "min_lr": 0.05, "reset_start": 2},
    ],
)
def test_our_greedy_lr_equals_transformers_step_by_step(kwargs, tmp_path) -> None:
    up_opt, our_opt = _optimizer(), _optimizer()
    up, mine = Upstream(up_opt, **kwargs), ours.GreedyLR(our_opt, **kwargs)
    for i, metric in enumerate(METRICS * 2):
        up.step(metric)
        mine.step(metric)
        assert [g["lr"] for g in our_opt.param_groups] == [g["lr"] for g in up_opt.param_groups], (i, kwargs)
        assert mine.get_last_lr() == up.get_last_lr()
    assert len({tuple(lrs) for lrs in [up.get_last_lr()]}) == 1
    assert mine.state_dict() == up.state_dict()
    # a checkpoint of ours loads weights-only and continues as upstream's would
    torch.save(mine.state_dict(), tmp_path / "scheduler.pt")
    fresh_opt = _optimizer()
    fresh = ours.GreedyLR(fresh_opt, **kwargs)
    fresh.load_state_dict(torch.load(tmp_path / "scheduler.pt", weights_only=True))
    assert [g["lr"] for g in fresh_opt.param_groups] == up.get_last_lr()
    for metric in METRICS:
        up.step(metric)
        fresh.step(metric)
    assert fresh.state_dict() == up.state_dict()


def test_the_lr_moves_both_ways() -> None:
    optimizer = _optimizer()
    scheduler = ours.GreedyLR(optimizer, patience=1, factor=0.5, min_lr=1e-4)
    lrs = [0.1]
    for metric in METRICS:
        scheduler.step(metric)
        lrs.append(optimizer.param_groups[0]["lr"])
    moves = {(b > a) - (b < a) for a, b in zip(lrs, lrs[1:])}
    assert moves == {-1, 0, 1}  # up after improvements, down after stalls


def test_argument_checks_match_upstream() -> None:
    for kwargs in ({"factor": 1.0}, {"mode": "up"}, {"threshold_mode": "pct"}, {"min_lr": [0.1]}):
        with pytest.raises(ValueError):
            Upstream(_optimizer(), **kwargs)
        with pytest.raises(ValueError, match="GreedyLR"):
            ours.GreedyLR(_optimizer(), **kwargs)
    with pytest.raises(TypeError, match="not an Optimizer"):
        ours.GreedyLR(object())  # type: ignore[arg-type]


def test_greedy_by_name_is_upstreams_class_else_ours(monkeypatch) -> None:
    scheduler = get_scheduler("greedy", _optimizer(), 5, 100, scheduler_specific_kwargs={"patience": 3})
    assert type(scheduler) is Upstream and scheduler.patience == 3
    import trainwright

    # exported at the top level, as transformers does
    assert trainwright.get_greedy_schedule(_optimizer(), factor=0.5).factor == 0.5
    with pytest.raises(ValueError, match="lr scheduler 'greedy'.*patients"):
        get_scheduler("greedy", _optimizer(), scheduler_specific_kwargs={"patients": 3})
    monkeypatch.setattr(ours.importlib.util, "find_spec", lambda name: None)
    assert type(get_scheduler("greedy", _optimizer())) is ours.GreedyLR


def test_steps_on_metric() -> None:
    optimizer = _optimizer()

    class TakesMetric:
        def step(self, metric):
            pass

    class NamedMetrics:
        def step(self, metrics=None):
            pass

    class PerStep:
        def step(self, epoch=None):
            pass

    assert steps_on_metric(torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer))
    assert steps_on_metric(Upstream(optimizer)) and steps_on_metric(ours.GreedyLR(optimizer))
    assert steps_on_metric(TakesMetric()) and steps_on_metric(NamedMetrics())
    assert not steps_on_metric(PerStep())
    assert not steps_on_metric(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))
    assert not steps_on_metric(get_scheduler("linear", optimizer, 1, 10))
    assert not steps_on_metric(None)


class LogsLearningRate(Trainer):
    """Upstream's test subclass: the one-argument `log` of transformers < 4.47 (item 5 too)."""

    def log(self, logs):
        if hasattr(self.lr_scheduler, "_last_lr"):
            logs["learning_rate"] = self.lr_scheduler._last_lr[0]
        super().log(logs)


def test_trainer_with_lr_scheduler_type_greedy(make_args) -> None:
    args = make_args(
        lr_scheduler_type="greedy",
        lr_scheduler_kwargs={"patience": 1, "factor": 0.5},
        eval_strategy="epoch",
        metric_for_best_model="eval_loss",
        num_train_epochs=10,
        learning_rate=0.2,
        logging_strategy="epoch",
    )
    trainer = regression_with_eval(LogsLearningRate, args)
    trainer.train()
    assert isinstance(trainer.lr_scheduler, Upstream)
    assert trainer.lr_scheduler.last_epoch == 10  # stepped once per evaluation, with its metric
    lrs = [row["learning_rate"] for row in trainer.state.log_history if "learning_rate" in row]
    assert len(set(lrs)) > 1, "GreedyLR should have moved the LR at least once"


def _recording(cls: type) -> type:
    class Recording(cls):
        def step(self, metrics, epoch=None):
            self.seen.append(metrics)
            super().step(metrics, epoch)

    return Recording


@pytest.mark.parametrize(
    "cls, kwargs", [(Upstream, {"factor": 0.8, "patience": 5, "cooldown": 2}), (ours.GreedyLR, {})]
)
def test_a_greedy_lr_passed_in_is_stepped_with_the_eval_metric(make_args, cls, kwargs) -> None:
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = _recording(cls)(optimizer, **kwargs)
    scheduler.seen = []
    args = make_args(eval_strategy="epoch", metric_for_best_model="eval_loss", num_train_epochs=3)
    trainer = regression_with_eval(Trainer, args, model=model, optimizers=(optimizer, scheduler))
    trainer.train()
    evals = [row["eval_loss"] for row in trainer.state.log_history if "eval_loss" in row]
    assert scheduler.seen == pytest.approx(evals) and len(evals) == 3
    assert trainer.lr_scheduler is scheduler and (scheduler.factor, scheduler.patience) == (
        kwargs.get("factor", 0.95),
        kwargs.get("patience", 10),
    )


def test_greedy_resumes_exactly(make_args) -> None:
    def run(resume=None, **kw):
        torch.manual_seed(0)
        args = make_args(
            lr_scheduler_type="greedy",
            lr_scheduler_kwargs={"patience": 0, "factor": 0.5, "min_lr": 1e-3},
            eval_strategy="epoch",
            save_strategy="epoch",
            num_train_epochs=4,
            learning_rate=0.2,
            **kw,
        )
        trainer = regression_with_eval(Trainer, args, length=32)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = run()
    resumed = run(resume=os.path.join(straight.args.output_dir, "checkpoint-8"))
    assert resumed.lr_scheduler.state_dict() == straight.lr_scheduler.state_dict()
    assert torch.equal(resumed.model.a, straight.model.a)

"""The per-step optimizer chores done with less work than torch's generic code, with the same
result: the LambdaLR schedules' `step()` and gradients set to None between steps."""

from __future__ import annotations

import pytest
import torch
from optim_kit import PARITY_CASES
from torch.autograd import profiler
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from trainwright.optim.schedules import get_scheduler
from trainwright.optim.zeroing import grads_to_none


def _optimizer(lr: float | torch.Tensor = 0.1) -> torch.optim.Optimizer:
    groups = [
        {"params": [torch.nn.Parameter(torch.zeros(2))]},
        {"params": [torch.nn.Parameter(torch.zeros(2))], "lr": 0.03},
    ]
    return torch.optim.SGD(groups, lr=lr)


@pytest.mark.parametrize(("name", "kwargs"), PARITY_CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_schedule_step_equals_torch_lambda_lr_bit_for_bit(name: str, kwargs: dict) -> None:
    ours_opt, torch_opt = _optimizer(), _optimizer()
    ours = get_scheduler(name, ours_opt, 10, 100, dict(kwargs))
    theirs = LambdaLR(torch_opt, list(ours.lr_lambdas))  # the same curves, torch's own step
    for step in range(115):  # past the end of training
        assert [g["lr"] for g in ours_opt.param_groups] == [g["lr"] for g in torch_opt.param_groups], step
        ours_opt.step(), torch_opt.step()
        ours.step(), theirs.step()
        assert ours.get_last_lr() == theirs.get_last_lr()
    mine, torchs = ours.state_dict(), theirs.state_dict()
    assert mine == torchs


def test_schedule_step_skips_torchs_generic_update_for_float_rates(monkeypatch) -> None:
    """torch's `_update_lr` (a context manager, list copies, a helper call per group) runs on the
    first step only; after that the rates are written directly."""
    calls = []
    original = LRScheduler._update_lr
    monkeypatch.setattr(LRScheduler, "_update_lr", lambda self, *a: calls.append(1) or original(self, *a))
    opt = _optimizer()
    scheduler = get_scheduler("linear", opt, 2, 10)
    for _ in range(5):
        opt.step()
        scheduler.step()
    assert len(calls) == 1  # the first step: torch's order warnings
    assert scheduler.last_epoch == 5 and scheduler._step_count == 6


def test_schedule_step_with_tensor_rates_fills_them_in_place_as_torch_does() -> None:
    opt = _optimizer(lr=torch.tensor(0.1))
    opt.param_groups[1]["lr"] = torch.tensor(0.03)
    rates = [g["lr"] for g in opt.param_groups]
    scheduler = get_scheduler("linear", opt, 2, 10)
    for _ in range(4):
        opt.step()
        scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == rates  # the same tensors (a captured graph reads them)
    assert [float(r) for r in rates] == pytest.approx([0.1 * 0.75, 0.03 * 0.75])


def _with_grads(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    params = [p for g in opt.param_groups for p in g["params"]]
    for p in params:
        p.grad = torch.ones_like(p)
    return params


class _CountingRanges:
    """Stands in for `torch.autograd.profiler.record_function`, counting the ranges opened."""

    opened = 0

    def __init__(self, name: str, args: str | None = None) -> None:
        type(self).opened += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def test_grads_to_none_opens_no_profiler_range_unless_a_profiler_records(monkeypatch) -> None:
    monkeypatch.setattr(profiler, "record_function", _CountingRanges)
    _CountingRanges.opened = 0
    opt = _optimizer()
    zero = grads_to_none(opt)
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})  # added after binding
    params = _with_grads(opt)
    zero()
    assert all(p.grad is None for p in params) and _CountingRanges.opened == 0
    monkeypatch.setattr(profiler, "_is_profiler_enabled", True)
    params = _with_grads(opt)
    zero()  # torch's own, with its range
    assert all(p.grad is None for p in params) and _CountingRanges.opened == 1


def test_grads_to_none_keeps_an_optimizers_own_zero_grad() -> None:
    class Own(torch.optim.SGD):
        calls: list[bool] = []

        def zero_grad(self, set_to_none: bool = True) -> None:
            self.calls.append(set_to_none)
            super().zero_grad(set_to_none)

    opt = Own([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    params = _with_grads(opt)
    grads_to_none(opt)()
    assert Own.calls == [True] and params[0].grad is None


def test_grads_to_none_keeps_a_zero_grad_set_on_the_instance() -> None:
    opt = _optimizer()
    calls = []
    opt.zero_grad = lambda set_to_none=True: calls.append(set_to_none)  # type: ignore[method-assign]
    grads_to_none(opt)()
    assert calls == [True]


def test_a_profiled_training_run_still_records_the_zero_grad_range(tmp_path) -> None:
    """Under torch.profiler the Trainer's zeroing is torch's, so the trace has its range."""
    from trainwright import Trainer, TrainingArguments

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}

    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(12)]
    args = TrainingArguments(
        tmp_path, max_steps=3, per_device_train_batch_size=4, report_to=[], save_strategy="no", use_cpu=True
    )
    trainer = Trainer(model=Model(), args=args, train_dataset=data)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.train()
    names = [e.name for e in prof.events()]
    assert names.count("Optimizer.zero_grad#AdamW.zero_grad") == 4  # before the first step, after each

"""optim="adafactor": transformers' Adafactor with upstream's kwargs, and our copy of its update rule.

Upstream: tests/trainer/test_trainer.py `TrainerOptimizerChoiceTest.test_optim_supported`
(`OptimizerNames.ADAFACTOR` -> `transformers.optimization.Adafactor` with `scale_parameter=False,
relative_step=False`) and test_trainer_optimizers.py `test_adafactor_lr_none`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainwright.optim import adafactor as ours
from trainwright.optim.optimizers import create_optimizer, get_optimizer_cls_and_kwargs
from trainwright.optim.schedules import get_scheduler

transformers = pytest.importorskip("transformers")
from transformers.optimization import Adafactor as Upstream  # noqa: E402


class Tiny(nn.Module):
    """1-D (bias, norm), 2-D (factored) and 3-D parameters, so every branch of the rule runs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)
        self.cube = nn.Parameter(torch.randn(2, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.linear(x))
        return torch.einsum("bi,kij->bkj", h, self.cube).sum(-1)


def _pair(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    a = Tiny().to(dtype)
    b = Tiny().to(dtype)
    b.load_state_dict(a.state_dict())
    return a, b


def _step_both(kwargs: dict, steps: int = 10, dtype: torch.dtype = torch.float32, groups=None) -> None:
    a, b = _pair(dtype=dtype)
    make = groups or (lambda m: m.parameters())
    up, mine = Upstream(make(a), **kwargs), ours.Adafactor(make(b), **kwargs)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 4, generator=generator).to(dtype)
        for model, optimizer in ((a, up), (b, mine)):
            optimizer.zero_grad()
            model(x).float().pow(2).mean().backward()
            optimizer.step()
        for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
            assert torch.equal(pa, pb), (kwargs, name)
    for key, value in up.state_dict()["state"][0].items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(mine.state_dict()["state"][0][key])), key


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 1e-2, "scale_parameter": False, "relative_step": False},  # what optim="adafactor" builds
        {"lr": 1e-2, "scale_parameter": False, "relative_step": False, "beta1": 0.9, "weight_decay": 0.1},
        {"lr": 3e-2, "scale_parameter": True, "relative_step": False, "clip_threshold": 0.5},
        {"lr": None},  # relative step with parameter scaling (upstream's defaults)
        {"lr": None, "warmup_init": True, "decay_rate": -0.6, "eps": (1e-29, 1e-2)},
    ],
)
def test_our_adafactor_equals_transformers_step_by_step(kwargs) -> None:
    _step_both(kwargs)


def test_equal_in_bfloat16_and_with_decay_groups() -> None:
    _step_both({"lr": 1e-2, "scale_parameter": False, "relative_step": False}, dtype=torch.bfloat16)

    def groups(model: nn.Module) -> list[dict]:
        return [
            {"params": [model.linear.weight, model.cube], "weight_decay": 0.1},
            {"params": [model.linear.bias, model.norm.weight, model.norm.bias], "weight_decay": 0.0},
        ]

    _step_both({"lr": 1e-2, "scale_parameter": False, "relative_step": False}, groups=groups)


def test_argument_checks_match_upstream() -> None:
    params = [nn.Parameter(torch.ones(2))]
    for kwargs in ({"lr": 1e-3}, {"lr": None, "relative_step": False, "warmup_init": True}):
        with pytest.raises(ValueError):
            Upstream(params, **kwargs)
        with pytest.raises(ValueError, match="relative_step"):
            ours.Adafactor(params, **kwargs)


def test_optim_adafactor_is_upstreams_class_and_kwargs() -> None:
    args = transformers.TrainingArguments("unused", optim="adafactor", learning_rate=3e-3, report_to="none")
    expected = transformers.Trainer.get_optimizer_cls_and_kwargs(args)
    assert expected == (Upstream, {"lr": 3e-3, "scale_parameter": False, "relative_step": False})
    assert get_optimizer_cls_and_kwargs(args) == expected


def test_trainer_with_adafactor_follows_transformers_trajectory(tmp_path) -> None:
    """A real run: ten steps with optim="adafactor" give transformers' weights exactly."""
    import trainwright

    torch.manual_seed(0)
    data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(40)]

    class Regressor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 1)

        def forward(self, x, labels=None):
            out = self.linear(x)
            return {"loss": nn.functional.mse_loss(out, labels), "logits": out}

    results = []
    for module in (transformers, trainwright):
        torch.manual_seed(0)
        model = Regressor()
        args = module.TrainingArguments(
            str(tmp_path / module.__name__),
            optim="adafactor",
            learning_rate=0.05,
            max_steps=10,
            per_device_train_batch_size=4,
            report_to="none",
            save_strategy="no",
            seed=0,
            lr_scheduler_type="constant",
            use_cpu=True,
            weight_decay=0.0,
        )
        module.Trainer(model, args, train_dataset=data).train()
        results.append(model.linear.weight.detach().clone())
    assert torch.equal(results[1], results[0]), (results[1], results[0])


def test_without_transformers_our_class_is_used(monkeypatch) -> None:
    monkeypatch.setattr(ours.importlib.util, "find_spec", lambda name: None)
    assert ours.adafactor_class() is ours.Adafactor
    model = nn.Linear(4, 3)
    optimizer = create_optimizer(model, _Args())
    assert isinstance(optimizer, ours.Adafactor)
    assert optimizer.defaults["scale_parameter"] is False and optimizer.defaults["relative_step"] is False
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=4)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.75e-3)


class _Args:
    optim = "adafactor"
    learning_rate = 1e-3
    weight_decay = 0.0
    optim_args = None

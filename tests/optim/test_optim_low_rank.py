"""GaLore, APOLLO and LOMO through the Trainer: layer-wise and in-backward updates that follow the
schedule, and the settings, devices and models these optimizers need, checked with a clear message.

Each test is skipped when its package is missing.
"""

from __future__ import annotations

import pytest
from optim_kit import LAYERWISE, LOW_RANK, Net, assert_trains, make_trainer

from trainwright import Trainer, TrainingArguments
from trainwright.optim.extra import LayerWiseOptimizer


@pytest.mark.parametrize(
    ("name", "module"),
    [("galore_adamw_8bit", "galore_torch"), ("galore_adamw_8bit_layerwise", "galore_torch")],
)
def test_cuda_only_optimizers_refuse_cpu_parameters(name, module) -> None:
    pytest.importorskip(module)
    args = TrainingArguments(output_dir="unused", optim=name, optim_target_modules=["up"], max_grad_norm=0)
    with pytest.raises(ValueError, match=f"optim='{name}' needs the parameters on CUDA"):
        Trainer.get_optimizer_cls_and_kwargs(args, Net())


def test_adalomo_needs_cuda_parameters() -> None:
    pytest.importorskip("lomo_optim")
    args = TrainingArguments(output_dir="unused", optim="adalomo")
    with pytest.raises(ValueError, match="optim='adalomo' needs the parameters on CUDA"):
        Trainer.get_optimizer_cls_and_kwargs(args, Net())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_grad_norm": 0}, "needs optim_target_modules"),
        (
            {"optim_target_modules": ["nothing_here"], "max_grad_norm": 0},
            r"no nn.Linear matches optim_target_modules=\['nothing_here'\]",
        ),
        (
            {"optim_target_modules": ["up"], "max_grad_norm": 1.0},
            "gradients cannot be clipped: set max_grad_norm=0",
        ),
        (
            {"optim_target_modules": ["up"], "max_grad_norm": 0, "gradient_accumulation_steps": 2},
            "set gradient_accumulation_steps=1",
        ),
    ],
)
def test_low_rank_settings_are_checked(settings, message) -> None:
    pytest.importorskip("galore_torch")
    args = TrainingArguments(output_dir="unused", optim="galore_adamw_layerwise", **settings)
    with pytest.raises((ValueError, TypeError), match=message):
        Trainer.get_optimizer_cls_and_kwargs(args, Net())


def test_low_rank_needs_the_model() -> None:
    pytest.importorskip("apollo_torch")
    args = TrainingArguments(output_dir="unused", optim="apollo_adamw", optim_target_modules=["up"])
    with pytest.raises(ValueError, match="optim='apollo_adamw' needs the model"):
        Trainer.get_optimizer_cls_and_kwargs(args)


def test_layerwise_steps_in_the_backward_and_follows_the_schedule(tmp_path) -> None:
    pytest.importorskip("galore_torch")
    trainer = make_trainer(
        tmp_path,
        "galore_adamw_layerwise",
        steps=20,
        lr_scheduler_type="linear",
        **LOW_RANK,
        **LAYERWISE,
    )
    trainer.train()
    optimizer = trainer.optimizer
    assert isinstance(optimizer, LayerWiseOptimizer)
    inner = optimizer.optimizer_dict[trainer.model.up.weight]
    assert inner.param_groups[0]["rank"] == 8 and inner.param_groups[0]["weight_decay"] == 0.01
    assert optimizer.optimizer_dict[trainer.model.up.bias].param_groups[0]["weight_decay"] == 0.0
    # the linear schedule set every inner optimizer's learning rate: 0 after the last step
    assert {g["lr"] for opt in optimizer.optimizer_dict.values() for g in opt.param_groups} == {0.0}
    assert inner.state[trainer.model.up.weight]["step"] == 20


def test_lomo_updates_in_the_backward_and_clips_with_max_grad_norm(tmp_path) -> None:
    pytest.importorskip("lomo_optim")
    trainer = assert_trains(tmp_path, "lomo", learning_rate=0.1, max_grad_norm=0.5)
    assert trainer.optimizer.clip_grad_norm == 0.5 and trainer.optimizer.clip_coef is not None
    assert trainer.optimizer.weight_decay == 0.01
    assert all(p.grad is None for p in trainer.model.parameters())  # LOMO frees each gradient
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(
        TrainingArguments(output_dir="unused", optim="lomo", max_grad_norm=0), Net()
    )
    assert "clip_grad_norm" not in kwargs and isinstance(kwargs["model"], Net)
    with pytest.raises(ValueError, match="optim='lomo' needs the model"):
        Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(output_dir="unused", optim="lomo"))
    args = TrainingArguments(output_dir="unused", optim="lomo", gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="set gradient_accumulation_steps=1"):
        Trainer.get_optimizer_cls_and_kwargs(args, Net())


def test_lomo_with_fp16_is_refused_naming_both(tmp_path) -> None:
    """The fp16 grad scaler's backward would bypass LOMO's fused update (upstream trains nothing)."""
    pytest.importorskip("lomo_optim")
    trainer = make_trainer(tmp_path, "lomo", fp16=True)
    with pytest.raises(ValueError, match=r"optim='lomo' cannot be combined with fp16"):
        trainer.train()

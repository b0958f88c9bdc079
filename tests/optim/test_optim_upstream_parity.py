"""Optional-package optimizers built as transformers 5.23 builds them: the same class and kwargs from
the same settings, every upstream name handled, a missing package named with its pip command, and
transformers' enums and `get_optimizer_cls_and_kwargs` API accepted.

Each test is skipped when its package is missing.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from optim_kit import CPU_CASES, Net, TokenSum
from torch import nn

from trainwright import Trainer, TrainingArguments
from trainwright.optim.extra import EXTRA_OPTIMIZER_NAMES
from trainwright.optim.optimizers import get_optimizer_cls_and_kwargs


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_every_upstream_name_is_handled() -> None:
    training_args = pytest.importorskip("transformers.training_args")
    from trainwright.optim.optimizers import OPTIMIZER_NAMES

    upstream = {m.value for m in training_args.OptimizerNames}
    assert upstream <= set(OPTIMIZER_NAMES)
    assert {"adamw_torch", "sgd", "adagrad", "rmsprop", "adafactor"} | set(EXTRA_OPTIMIZER_NAMES) >= (
        upstream - {"adamw_torch_fused"}
    )
    cpu_or_device_only = set(CPU_CASES) | {
        "adamw_torch_xla",
        "adamw_torch_npu_fused",
        "adamw_anyprecision",
        "galore_adamw_8bit",
        "galore_adamw_8bit_layerwise",
        "adalomo",
    }
    assert upstream - {"adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop", "adafactor"} == (
        cpu_or_device_only
    )


_SPECIAL_KWARGS = ("params", "model", "optimizer_dict")


def _both(name: str, model: nn.Module | None = None, **settings):
    """(upstream, ours) results of get_optimizer_cls_and_kwargs for the same settings."""
    transformers = pytest.importorskip("transformers")
    upstream_args = transformers.TrainingArguments(output_dir="unused", optim=name, **settings)
    ours_args = TrainingArguments(output_dir="unused", optim=name, **settings)
    upstream = transformers.Trainer.get_optimizer_cls_and_kwargs(upstream_args, model)
    ours = Trainer.get_optimizer_cls_and_kwargs(ours_args, model)
    return upstream, ours


@pytest.mark.parametrize(
    "name",
    sorted(n for n in CPU_CASES if not n.endswith("_layerwise") and n != "lomo"),
)
def test_class_and_kwargs_match_transformers(name: str) -> None:
    module, settings, _ = CPU_CASES[name]
    pytest.importorskip(module)
    settings = {k: v for k, v in settings.items() if k != "learning_rate"}
    (up_cls, up_kwargs), (cls, kwargs) = _both(name, Net(), learning_rate=3e-3, weight_decay=0.05, **settings)
    assert cls is up_cls
    strip = lambda d: {k: v for k, v in d.items() if k not in _SPECIAL_KWARGS}  # noqa: E731
    assert strip(kwargs) == strip(up_kwargs)
    if "params" in up_kwargs:  # GaLore/APOLLO: the same targeted weights with the same projection
        targeted = [g for g in up_kwargs["params"] if "rank" in g]
        ours = [g for g in kwargs["params"] if "rank" in g]
        assert [p for g in ours for p in g["params"]] == targeted[0]["params"]
        assert {k: v for k, v in ours[0].items() if k not in ("params", "weight_decay")} == {
            k: v for k, v in targeted[0].items() if k != "params"
        }
        # unlike upstream, weight_decay reaches the groups: 0 for biases and norms
        assert {g["weight_decay"] for g in kwargs["params"]} == {0.05, 0.0}


@pytest.mark.parametrize(
    ("name", "optim_args", "expected"),
    [
        (
            "ademamix",
            "beta1=0.8,beta3=0.999,alpha=8,t_alpha=100",
            {"betas": (0.8, 0.999, 0.999), "alpha": 8.0},
        ),
        ("schedule_free_adamw", "r=0.5,weight_lr_power=1.0", {"r": 0.5, "weight_lr_power": 1.0}),
        (
            "stable_adamw",
            "max_lr=0.01,decouple_lr=true,kahan_sum=true",
            {"max_lr": 0.01, "decouple_lr": True},
        ),
        ("grokadamw", "lamb=3.0,gamma=0.2", {"lamb": 3.0, "gamma": 0.2}),
        ("adamw_torch_8bit", "bf16_stochastic_round=true", {"bf16_stochastic_round": True}),
    ],
)
def test_optim_args_are_read_as_upstream(name: str, optim_args: str, expected: dict) -> None:
    pytest.importorskip(CPU_CASES[name][0])
    (_, up_kwargs), (_, kwargs) = _both(name, Net(), optim_args=optim_args)
    for key, value in expected.items():
        assert kwargs[key] == value == up_kwargs[key], key


def test_optim_args_the_optimizer_does_not_take_are_refused() -> None:
    pytest.importorskip("bitsandbytes")
    # amsgrad is a bitsandbytes AdamW argument: passed on (upstream would drop it silently)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(
        TrainingArguments(output_dir="unused", optim="adamw_bnb_8bit", optim_args="amsgrad=true")
    )
    assert kwargs["amsgrad"] is True
    args = TrainingArguments(output_dir="unused", optim="adamw_bnb_8bit", optim_args="momentum=0.9")
    with pytest.raises(ValueError, match=r"optim_args \['momentum'\] not accepted by AdamW"):
        Trainer.get_optimizer_cls_and_kwargs(args)


# --------------------------------------------------------------- missing packages, named with pip


@pytest.mark.parametrize(
    ("name", "module", "message"),
    [
        ("schedule_free_adamw", "schedulefree", "the 'schedulefree' package: pip install schedulefree"),
        ("adamw_bnb_8bit", "bitsandbytes", "the 'bitsandbytes' package: pip install bitsandbytes"),
        ("lion_32bit", "bitsandbytes", "pip install bitsandbytes"),
        ("rmsprop_bnb", "bitsandbytes", "pip install bitsandbytes"),
        ("adamw_torch_4bit", "torchao", "the 'torchao' package: pip install torchao"),
        ("stable_adamw", "optimi", "the 'torch-optimi' package: pip install torch-optimi"),
        ("grokadamw", "grokadamw", "pip install grokadamw"),
        ("lomo", "lomo_optim", "the 'lomo-optim' package: pip install lomo-optim"),
        ("galore_adamw", "galore_torch", "the 'galore-torch' package: pip install galore-torch"),
        ("apollo_adamw", "apollo_torch", "the 'apollo-torch' package: pip install apollo-torch"),
    ],
)
def test_a_missing_package_is_named_with_its_pip_command(monkeypatch, name, module, message) -> None:
    import sys

    for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    args = TrainingArguments(output_dir="unused", optim=name, optim_target_modules=["up"])
    with pytest.raises(ImportError, match=f"optim=.{name}. needs .*{message}"):
        Trainer.get_optimizer_cls_and_kwargs(args, Net())
    with pytest.raises(ValueError, match=f"optim=.{name}. needs"):  # what upstream raises for some
        Trainer.get_optimizer_cls_and_kwargs(args, Net())


@pytest.mark.parametrize(
    ("name", "module", "message"),
    [
        (
            "adamw_torch_xla",
            "torch_xla",
            r"'torch-xla' package on an XLA device \(TPU\): pip install 'torch-xla\[tpu\]'",
        ),
        ("adamw_torch_npu_fused", "torch_npu", "'torch-npu' package on an Ascend NPU: pip install torch-npu"),
        (
            "adamw_apex_fused",
            "apex",
            "'NVIDIA apex' package on CUDA: pip install .* git\\+https://github.com/NVIDIA/apex",
        ),
        ("adamw_anyprecision", "torchdistx", "pip install git\\+https://github.com/pytorch/torchdistx"),
    ],
)
def test_device_optimizers_name_their_package(name, module, message) -> None:
    if _has(module):
        pytest.skip(f"{module} is installed")
    args = TrainingArguments(output_dir="unused", optim=name)
    with pytest.raises(ImportError, match=f"optim='{name}' needs .*{message}"):
        Trainer.get_optimizer_cls_and_kwargs(args, Net())
    with pytest.raises(ValueError, match=f"optim='{name}' needs"):  # upstream: "Trainer failed to import ..."
        Trainer.get_optimizer_cls_and_kwargs(args, Net())


# ---------------------------------------------------------------------- transformers' enums and API


def test_every_transformers_optimizer_name_enum_works_like_its_string() -> None:
    training_args = pytest.importorskip("transformers.training_args")
    for member in training_args.OptimizerNames:
        by_enum = TrainingArguments(output_dir="unused", optim=member)
        by_string = TrainingArguments(output_dir="unused", optim=member.value)
        assert by_enum.optim == by_string.optim == member.value
        assert type(by_enum.optim) is type(by_string.optim)
    args = TrainingArguments(output_dir="unused", optim=training_args.OptimizerNames.ADAMW_TORCH)
    assert Trainer.get_optimizer_cls_and_kwargs(args)[0] is torch.optim.AdamW
    # a bare args object holding transformers' member works too
    args.optim = training_args.OptimizerNames.SGD
    assert get_optimizer_cls_and_kwargs(args)[0] is torch.optim.SGD


def test_transformers_str_enums_are_accepted_wherever_their_string_is() -> None:
    training_args = pytest.importorskip("transformers.training_args")
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    from trainwright.core import enums

    cases = {
        "eval_strategy": (training_args.IntervalStrategy.STEPS, enums.IntervalStrategy),
        "logging_strategy": (training_args.IntervalStrategy.EPOCH, enums.IntervalStrategy),
        "save_strategy": (trainer_utils.SaveStrategy.BEST, enums.SaveStrategy),
        "hub_strategy": (training_args.HubStrategy.CHECKPOINT, enums.HubStrategy),
        "lr_scheduler_type": (trainer_utils.SchedulerType.COSINE_WITH_RESTARTS, enums.SchedulerType),
    }
    settings = {name: member for name, (member, _) in cases.items()}
    args = TrainingArguments(
        output_dir="unused",
        metric_for_best_model="loss",
        debug=[training_args.DebugOption.UNDERFLOW_OVERFLOW],
        **settings,
    )
    plain = TrainingArguments(
        output_dir="unused",
        metric_for_best_model="loss",
        debug="underflow_overflow",
        **{name: member.value for name, member in settings.items()},
    )
    for name, (member, ours) in cases.items():
        assert getattr(args, name) == getattr(plain, name) == member.value
        assert type(getattr(args, name)) is ours
    assert args.debug == plain.debug == [enums.DebugOption.UNDERFLOW_OVERFLOW]
    assert args.to_dict() == plain.to_dict()


def test_get_scheduler_takes_transformers_scheduler_type() -> None:
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    from trainwright.optim.schedules import get_scheduler

    def lrs(name) -> list[float]:
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
        kwargs = {"min_lr_rate": 0.1} if "min_lr" in getattr(name, "value", name) else {}
        schedule = get_scheduler(name, optimizer, 2, 10, scheduler_specific_kwargs=kwargs)
        out = []
        for _ in range(10):
            optimizer.step()
            schedule.step()
            out.append(optimizer.param_groups[0]["lr"])
        return out

    for member in trainer_utils.SchedulerType:
        if member.value in ("greedy", "reduce_lr_on_plateau", "warmup_stable_decay"):
            continue  # metric-driven (greedy, plateau) or not following num_training_steps (wsd)
        assert lrs(member) == lrs(member.value), member


def test_trainer_get_optimizer_cls_and_kwargs_has_upstream_signature() -> None:
    transformers = pytest.importorskip("transformers")
    import inspect

    assert isinstance(inspect.getattr_static(Trainer, "get_optimizer_cls_and_kwargs"), staticmethod)
    ours = inspect.signature(Trainer.get_optimizer_cls_and_kwargs)
    upstream = inspect.signature(transformers.Trainer.get_optimizer_cls_and_kwargs)
    assert list(ours.parameters) == list(upstream.parameters) == ["args", "model"]
    assert ours.parameters["model"].default is None
    args = TrainingArguments(output_dir="unused", optim="sgd", learning_rate=0.3, optim_args="momentum=0.9")
    assert Trainer.get_optimizer_cls_and_kwargs(args) == (torch.optim.SGD, {"lr": 0.3, "momentum": 0.9})


def test_an_overridden_get_optimizer_cls_and_kwargs_is_used(tmp_path) -> None:
    class MyTrainer(Trainer):
        @staticmethod
        def get_optimizer_cls_and_kwargs(args, model=None):
            return torch.optim.SGD, {"lr": 0.05, "momentum": 0.5}

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to="none", save_strategy="no")
    trainer = MyTrainer(model=Net(), args=args, train_dataset=TokenSum())
    trainer.train()
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    assert trainer.optimizer.param_groups[0]["momentum"] == 0.5

"""Optimizers of optional packages (`pip install trainwright[optim]`) trained for real on CPU.

Each test is skipped when its package is missing; with the package the Trainer builds the same
class and kwargs as transformers 5.23 and the loss goes down.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainwright import Trainer, TrainerCallback, TrainingArguments
from trainwright.optim.extra import EXTRA_OPTIMIZER_NAMES, LayerWiseOptimizer
from trainwright.optim.optimizers import get_optimizer_cls_and_kwargs


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class TokenSum(Dataset):
    """4 tokens in [0, 16) -> their centred mean: learnable by an embedding and two Linear layers."""

    def __init__(self, length: int = 256, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 16, (length, 4), generator=generator)
        self.labels = (self.ids.float().mean(1) - 7.5) / 4

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"ids": self.ids[i], "labels": self.labels[i]}


class Net(nn.Module):
    # 64x64 weights: 4096 elements, the size from which bitsandbytes keeps 8-bit state
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(16, 64)
        self.up = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)
        self.down = nn.Linear(64, 1)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        out = self.down(self.norm(torch.relu(self.up(self.embed(ids).mean(1))))).squeeze(-1)
        result = {"logits": out}
        if labels is not None:
            result["loss"] = F.mse_loss(out, labels)
        return result


def _trainer(tmp_path, optim: str, steps: int = 40, **kwargs) -> Trainer:
    settings = {
        "learning_rate": 1e-2,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 64,
        "lr_scheduler_type": "constant",
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 10,
        "weight_decay": 0.01,
        "disable_tqdm": True,
        **kwargs,
    }
    args = TrainingArguments(output_dir=str(tmp_path), optim=optim, max_steps=steps, **settings)
    return Trainer(model=Net(), args=args, train_dataset=TokenSum(), eval_dataset=TokenSum(64, seed=1))


def _trains(tmp_path, optim: str, factor: float = 0.5, **kwargs) -> Trainer:
    trainer = _trainer(tmp_path, optim, **kwargs)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < factor * before, (optim, before, after)
    return trainer


# name -> (module that must import, TrainingArguments settings, class name built)
CPU_CASES = {
    "adamw_bnb_8bit": ("bitsandbytes", {}, "AdamW"),
    "adamw_8bit": ("bitsandbytes", {}, "AdamW"),
    "paged_adamw_32bit": ("bitsandbytes", {}, "AdamW"),
    "paged_adamw_8bit": ("bitsandbytes", {}, "AdamW"),
    "lion_32bit": ("bitsandbytes", {"learning_rate": 1e-3}, "Lion"),
    "lion_8bit": ("bitsandbytes", {"learning_rate": 1e-3}, "Lion"),
    "paged_lion_32bit": ("bitsandbytes", {"learning_rate": 1e-3}, "Lion"),
    "paged_lion_8bit": ("bitsandbytes", {"learning_rate": 1e-3}, "Lion"),
    "ademamix": ("bitsandbytes", {}, "AdEMAMix"),
    "ademamix_8bit": ("bitsandbytes", {}, "AdEMAMix"),
    "paged_ademamix_32bit": ("bitsandbytes", {}, "AdEMAMix"),
    "paged_ademamix_8bit": ("bitsandbytes", {}, "AdEMAMix"),
    "rmsprop_bnb": ("bitsandbytes", {"learning_rate": 1e-3}, "RMSprop"),
    "rmsprop_bnb_8bit": ("bitsandbytes", {"learning_rate": 1e-3}, "RMSprop"),
    "rmsprop_bnb_32bit": ("bitsandbytes", {"learning_rate": 1e-3}, "RMSprop"),
    "adamw_torch_4bit": ("torchao", {}, "AdamW4bit"),
    "adamw_torch_8bit": ("torchao", {}, "AdamW8bit"),
    "schedule_free_adamw": ("schedulefree", {}, "AdamWScheduleFree"),
    "schedule_free_sgd": ("schedulefree", {"learning_rate": 0.1}, "SGDScheduleFree"),
    "schedule_free_radam": ("schedulefree", {}, "RAdamScheduleFree"),
    "stable_adamw": ("optimi", {}, "StableAdamW"),
    "grokadamw": ("grokadamw", {}, "GrokAdamW"),
    "lomo": ("lomo_optim", {"learning_rate": 0.1}, "Lomo"),
    "galore_adamw": (
        "galore_torch",
        {"optim_target_modules": ["up"], "optim_args": "rank=8,update_proj_gap=10"},
        "AdamW",
    ),
    "galore_adafactor": (
        "galore_torch",
        {"optim_target_modules": ["up"], "optim_args": "rank=8,update_proj_gap=10"},
        "Adafactor",
    ),
    "galore_adamw_layerwise": (
        "galore_torch",
        {"optim_target_modules": ["up"], "optim_args": "rank=8,update_proj_gap=10", "max_grad_norm": 0},
        "LayerWiseOptimizer",
    ),
    "galore_adafactor_layerwise": (
        "galore_torch",
        {"optim_target_modules": "up|down", "optim_args": "rank=1,update_proj_gap=10", "max_grad_norm": 0},
        "LayerWiseOptimizer",
    ),
    "apollo_adamw": (
        "apollo_torch",
        {"optim_target_modules": "all-linear", "optim_args": "rank=8,update_proj_gap=10"},
        "AdamW",
    ),
    "apollo_adamw_layerwise": (
        "apollo_torch",
        {"optim_target_modules": "all-linear", "optim_args": "rank=8,update_proj_gap=10", "max_grad_norm": 0},
        "LayerWiseOptimizer",
    ),
}


@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_optimizer_trains_on_cpu(tmp_path, name: str) -> None:
    module, settings, class_name = CPU_CASES[name]
    pytest.importorskip(module)
    # torchao's low-bit optimizers compile their step: fewer steps keep the test short
    steps = 15 if name.startswith("adamw_torch_") else 40
    trainer = _trains(tmp_path, name, steps=steps, factor=0.5 if steps == 40 else 0.7, **settings)
    assert type(trainer.optimizer).__name__ == class_name
    if class_name != "LayerWiseOptimizer":
        assert type(trainer.optimizer).__module__.split(".")[0] == module


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


def test_bitsandbytes_8bit_keeps_8bit_state_and_fp32_embeddings(tmp_path) -> None:
    pytest.importorskip("bitsandbytes")
    trainer = _trains(tmp_path, "adamw_bnb_8bit")
    state = trainer.optimizer.state
    assert state[trainer.model.up.weight]["state1"].dtype == torch.uint8
    assert state[trainer.model.up.weight]["state2"].dtype == torch.uint8
    # as upstream, embeddings are optimised in 32 bits (bitsandbytes' module override)
    assert state[trainer.model.embed.weight]["state1"].dtype == torch.float32


class ModeRecorder(TrainerCallback):
    """Records the schedule-free `train_mode` flag at each prediction step and optimizer step."""

    def __init__(self) -> None:
        self.at_prediction: list[bool] = []
        self.at_step: list[bool] = []

    def on_prediction_step(self, args, state, control, optimizer=None, **kwargs):
        self.at_prediction.append(optimizer.param_groups[0]["train_mode"])

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.at_step.append(optimizer.param_groups[0]["train_mode"])


@pytest.mark.parametrize("name", ["schedule_free_adamw", "schedule_free_sgd", "schedule_free_radam"])
def test_schedule_free_swaps_weights_around_evaluation(tmp_path, name: str) -> None:
    pytest.importorskip("schedulefree")
    recorder = ModeRecorder()
    lr = CPU_CASES[name][1].get("learning_rate", 1e-2)
    trainer = _trainer(tmp_path, name, steps=30, learning_rate=lr, eval_strategy="steps", eval_steps=10)
    trainer.add_callback(recorder)
    trainer.train()
    # evaluation ran on the averaged (eval) weights, every optimizer step on the training weights
    assert recorder.at_prediction and not any(recorder.at_prediction)
    assert len(recorder.at_step) == 30 and all(recorder.at_step)
    optimizer = trainer.optimizer
    assert not optimizer.param_groups[0]["train_mode"]  # the final evaluation left eval weights in
    eval_weights = trainer.model.up.weight.detach().clone()
    optimizer.train()
    assert not torch.equal(eval_weights, trainer.model.up.weight)  # the two sequences really differ


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


# ----------------------------------------------------------------------------- refusals and errors


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
    trainer = _trainer(
        tmp_path,
        "galore_adamw_layerwise",
        steps=20,
        optim_target_modules=["up"],
        optim_args="rank=8,update_proj_gap=10",
        max_grad_norm=0,
        lr_scheduler_type="linear",
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
    trainer = _trains(tmp_path, "lomo", learning_rate=0.1, max_grad_norm=0.5)
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
    trainer = _trainer(tmp_path, "lomo", fp16=True)
    with pytest.raises(ValueError, match=r"optim='lomo' cannot be combined with fp16"):
        trainer.train()


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


@pytest.mark.parametrize(
    "name",
    [
        "adamw_bnb_8bit",
        "lion_8bit",
        "adamw_torch_8bit",
        "adamw_torch_4bit",
        "schedule_free_adamw",
        "stable_adamw",
        "grokadamw",
        "lomo",
        "galore_adamw",
        "galore_adamw_layerwise",
        "apollo_adamw",
    ],
)
def test_resume_is_exact(tmp_path, name: str) -> None:
    """The optimizer state goes through a weights-only checkpoint (torchao's quantized tensors and
    GaLore/APOLLO projectors as plain data) and training continues bit for bit."""
    module, settings, _ = CPU_CASES[name]
    pytest.importorskip(module)
    settings = {**settings, "save_strategy": "steps", "save_steps": 10}
    full = _trainer(tmp_path, name, steps=20, **settings)
    full.train()
    resumed = _trainer(tmp_path, name, steps=20, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-10"))
    for (key, expected), got in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(expected, got), key


# ------------------------------------------------------------------------------ CUDA-only optimizers

CUDA_CASES = {
    "galore_adamw_8bit": (
        "galore_torch",
        {"optim_target_modules": ["up"], "optim_args": "rank=8,update_proj_gap=10"},
        "AdamW8bit",
    ),
    "galore_adamw_8bit_layerwise": (
        "galore_torch",
        {"optim_target_modules": ["up"], "optim_args": "rank=8,update_proj_gap=10", "max_grad_norm": 0},
        "LayerWiseOptimizer",
    ),
    "adalomo": ("lomo_optim", {"learning_rate": 1e-2}, "AdaLomo"),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="these optimizers run on CUDA only")
@pytest.mark.parametrize("name", sorted(CUDA_CASES))
def test_cuda_only_optimizer_trains_on_cuda(tmp_path, name: str) -> None:
    module, settings, class_name = CUDA_CASES[name]
    pytest.importorskip(module)
    trainer = _trains(tmp_path, name, **settings)
    assert type(trainer.optimizer).__name__ == class_name
    assert next(trainer.model.parameters()).device.type == "cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="paged memory needs CUDA")
def test_paged_bitsandbytes_pages_on_cuda(tmp_path) -> None:
    pytest.importorskip("bitsandbytes")
    trainer = _trains(tmp_path, "paged_adamw_8bit")
    assert trainer.optimizer.is_paged
    assert trainer.optimizer.state[trainer.model.up.weight]["state1"].dtype == torch.uint8
    # bitsandbytes pages the state of tensors from 1e5 elements on
    from trainwright.optim.optimizers import build_optimizer

    big = nn.Linear(512, 512).cuda()
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(trainer.args, big)
    optimizer = build_optimizer(cls, kwargs, big, 0.0)
    big(torch.randn(2, 512, device="cuda")).sum().backward()
    optimizer.step()
    assert optimizer.state[big.weight]["state1"].is_paged


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

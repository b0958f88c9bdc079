"""Shared helpers of the optional-package optimizer tests (test_optim_packages_train.py,
test_optim_low_rank.py, test_optim_upstream_parity.py): a small learnable task, a Trainer on it, and
the table of optimizer names each package provides."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainwright import Trainer, TrainingArguments


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


def make_trainer(tmp_path, optim: str, steps: int = 40, **kwargs) -> Trainer:
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


def assert_trains(tmp_path, optim: str, factor: float = 0.5, **kwargs) -> Trainer:
    trainer = make_trainer(tmp_path, optim, **kwargs)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < factor * before, (optim, before, after)
    return trainer


def family(module: str, class_name: str, names: list[str], **settings) -> dict:
    """name -> (module that must import, TrainingArguments settings, class name built) for optimizer
    names one package builds alike."""
    return {name: (module, dict(settings), class_name) for name in names}


# GaLore / APOLLO project the gradients of the targeted Linear weights to this rank
LOW_RANK = {"optim_target_modules": ["up"], "optim_args": "rank=8,update_proj_gap=10"}
APOLLO = {**LOW_RANK, "optim_target_modules": "all-linear"}
LAYERWISE = {"max_grad_norm": 0}  # layer-wise optimizers step in the backward: nothing to clip

CPU_CASES = {
    **family(
        "bitsandbytes", "AdamW", ["adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit"]
    ),
    **family(
        "bitsandbytes",
        "Lion",
        ["lion_32bit", "lion_8bit", "paged_lion_32bit", "paged_lion_8bit"],
        learning_rate=1e-3,
    ),
    **family(
        "bitsandbytes",
        "AdEMAMix",
        ["ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit"],
    ),
    **family(
        "bitsandbytes",
        "RMSprop",
        ["rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit"],
        learning_rate=1e-3,
    ),
    **family("torchao", "AdamW4bit", ["adamw_torch_4bit"]),
    **family("torchao", "AdamW8bit", ["adamw_torch_8bit"]),
    **family("schedulefree", "AdamWScheduleFree", ["schedule_free_adamw"]),
    **family("schedulefree", "SGDScheduleFree", ["schedule_free_sgd"], learning_rate=0.1),
    **family("schedulefree", "RAdamScheduleFree", ["schedule_free_radam"]),
    **family("optimi", "StableAdamW", ["stable_adamw"]),
    **family("grokadamw", "GrokAdamW", ["grokadamw"]),
    **family("lomo_optim", "Lomo", ["lomo"], learning_rate=0.1),
    **family("galore_torch", "AdamW", ["galore_adamw"], **LOW_RANK),
    **family("galore_torch", "Adafactor", ["galore_adafactor"], **LOW_RANK),
    **family("galore_torch", "LayerWiseOptimizer", ["galore_adamw_layerwise"], **LOW_RANK, **LAYERWISE),
    **family(
        "galore_torch",
        "LayerWiseOptimizer",
        ["galore_adafactor_layerwise"],
        **{**LOW_RANK, "optim_target_modules": "up|down", "optim_args": "rank=1,update_proj_gap=10"},
        **LAYERWISE,
    ),
    **family("apollo_torch", "AdamW", ["apollo_adamw"], **APOLLO),
    **family("apollo_torch", "LayerWiseOptimizer", ["apollo_adamw_layerwise"], **APOLLO, **LAYERWISE),
}


# (name, scheduler_specific_kwargs) covering every schedule and its options
PARITY_CASES = [
    ("linear", {}),
    ("cosine", {}),
    ("cosine", {"num_cycles": 1.5}),
    ("cosine_with_restarts", {}),
    ("cosine_with_restarts", {"num_cycles": 3}),
    ("polynomial", {}),
    ("polynomial", {"lr_end": 1e-4, "power": 2.0}),
    ("constant", {}),
    ("constant_with_warmup", {}),
    ("inverse_sqrt", {}),
    ("inverse_sqrt", {"timescale": 25}),
    ("cosine_with_min_lr", {"min_lr": 1e-3}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.2, "num_cycles": 0.75}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", {"min_lr": 1e-3, "warmup_lr_rate": 0.05}),
    ("warmup_stable_decay", {"num_decay_steps": 30}),
    (
        "warmup_stable_decay",
        {"num_decay_steps": 20, "warmup_type": "cosine", "decay_type": "linear", "min_lr_ratio": 0.1},
    ),
    ("warmup_stable_decay", {"num_decay_steps": 25, "warmup_type": "1-sqrt", "decay_type": "1-sqrt"}),
    (
        "warmup_stable_decay",
        {"num_decay_steps": 20, "decay_type": "cosine", "num_cycles": 0.25, "min_lr_ratio": 0.05},
    ),
]

"""Optimizers of optional packages (`pip install trainwright[optim]`) trained for real: every CPU
optimizer lowers the loss, keeps its package's state, swaps schedule-free weights around evaluation
and resumes bit for bit; the CUDA-only ones train on CUDA.

Each test is skipped when its package is missing.
"""

from __future__ import annotations

import pytest
import torch
from optim_kit import CPU_CASES, LAYERWISE, LOW_RANK, assert_trains, family, make_trainer
from torch import nn

from trainwright import Trainer, TrainerCallback


@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_optimizer_trains_on_cpu(tmp_path, name: str) -> None:
    module, settings, class_name = CPU_CASES[name]
    pytest.importorskip(module)
    # torchao's low-bit optimizers compile their step: fewer steps keep the test short
    steps = 15 if name.startswith("adamw_torch_") else 40
    trainer = assert_trains(tmp_path, name, steps=steps, factor=0.5 if steps == 40 else 0.7, **settings)
    assert type(trainer.optimizer).__name__ == class_name
    if class_name != "LayerWiseOptimizer":
        assert type(trainer.optimizer).__module__.split(".")[0] == module


def test_bitsandbytes_8bit_keeps_8bit_state_and_fp32_embeddings(tmp_path) -> None:
    pytest.importorskip("bitsandbytes")
    trainer = assert_trains(tmp_path, "adamw_bnb_8bit")
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
    trainer = make_trainer(tmp_path, name, steps=30, learning_rate=lr, eval_strategy="steps", eval_steps=10)
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
    full = make_trainer(tmp_path, name, steps=20, **settings)
    full.train()
    resumed = make_trainer(tmp_path, name, steps=20, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-10"))
    for (key, expected), got in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(expected, got), key


# ------------------------------------------------------------------------------ CUDA-only optimizers


CUDA_CASES = {
    **family("galore_torch", "AdamW8bit", ["galore_adamw_8bit"], **LOW_RANK),
    **family("galore_torch", "LayerWiseOptimizer", ["galore_adamw_8bit_layerwise"], **LOW_RANK, **LAYERWISE),
    **family("lomo_optim", "AdaLomo", ["adalomo"], learning_rate=1e-2),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="these optimizers run on CUDA only")
@pytest.mark.parametrize("name", sorted(CUDA_CASES))
def test_cuda_only_optimizer_trains_on_cuda(tmp_path, name: str) -> None:
    module, settings, class_name = CUDA_CASES[name]
    pytest.importorskip(module)
    trainer = assert_trains(tmp_path, name, **settings)
    assert type(trainer.optimizer).__name__ == class_name
    assert next(trainer.model.parameters()).device.type == "cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="paged memory needs CUDA")
def test_paged_bitsandbytes_pages_on_cuda(tmp_path) -> None:
    pytest.importorskip("bitsandbytes")
    trainer = assert_trains(tmp_path, "paged_adamw_8bit")
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

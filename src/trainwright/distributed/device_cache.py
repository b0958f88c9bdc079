"""Emptying the accelerator's caching allocator (`torch_empty_cache_steps`, `auto_find_batch_size`)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch


def empty_device_cache(device: torch.device, collect_garbage: bool = False) -> None:
    """Give the allocator's cached, unused blocks on `device` back to the driver (CUDA, XPU, MPS,
    NPU; the CPU has no such cache). `collect_garbage` first frees unreachable Python objects that
    still hold tensors."""
    if collect_garbage:
        gc.collect()
    kind = device.type
    if kind == "cuda":
        torch.cuda.empty_cache()
    elif kind == "xpu":
        torch.xpu.empty_cache()
    elif kind == "mps":
        torch.mps.empty_cache()
        if hasattr(torch.mps, "clear_graph_cache"):  # cached MPS graphs hold memory too (as upstream)
            torch.mps.clear_graph_cache()
    elif kind == "npu":  # torch_npu registers torch.npu
        torch.npu.empty_cache()  # type: ignore[attr-defined]  # added at runtime by torch_npu; not in torch's stubs


class EmptyCacheEvery:
    """`torch_empty_cache_steps`: empty the cache during the micro-batches of every step whose
    `global_step` (steps done before it) is a multiple of N, after the forward and before the
    backward, as transformers does in `training_step`: a forward hook on the model while a run
    trains (`attach`), so the training step itself carries nothing for it."""

    def __init__(self, steps: int, device: torch.device):
        self.steps = steps
        self.device = device

    def __call__(self, global_step: int) -> None:
        if global_step % self.steps == 0:
            empty_device_cache(self.device)

    @contextlib.contextmanager
    def attach(self, model: torch.nn.Module, state: Any) -> Iterator[None]:
        """Empty the cache after each training forward of `model` at the steps above (`state`: the
        run's TrainerState, whose `global_step` is read at each forward)."""

        def after_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
            if module.training:  # an evaluation's forwards are not training steps
                self(state.global_step)

        handle = model.register_forward_hook(after_forward)
        try:
            yield
        finally:
            handle.remove()

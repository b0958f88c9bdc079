"""`Trainer.accelerator`: the part of accelerate's `Accelerator` that training scripts call on a
Trainer (process facts, barriers, gathers, unwrapping), answered by trainwright's runtime.

trainwright does not run on accelerate; anything else asked of this object raises an
AttributeError that says so, rather than pretending.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from trainwright.core.modules import unwrap_model as _unwrap


class RuntimeAccelerator:
    """What scripts use of `trainer.accelerator`, over a trainwright `Runtime`."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    @property
    def device(self) -> torch.device:
        return self._runtime.device

    @property
    def is_main_process(self) -> bool:
        return self._runtime.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self._runtime.is_local_main_process

    @property
    def process_index(self) -> int:
        return self._runtime.rank

    @property
    def local_process_index(self) -> int:
        return self._runtime.local_rank

    @property
    def num_processes(self) -> int:
        return self._runtime.world_size

    @property
    def use_distributed(self) -> bool:
        return self._runtime.distributed

    def wait_for_everyone(self) -> None:
        self._runtime.barrier()

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's tensor concatenated along the first dimension, in rank order."""
        parts = self._runtime.all_gather(tensor if tensor.dim() else tensor.reshape(1))
        return torch.cat(parts)

    def gather_for_metrics(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.gather(tensor)

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return self._runtime.all_reduce(tensor.clone(), reduction)

    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True) -> torch.nn.Module:
        return _unwrap(model)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self._runtime.is_local_main_process:
            print(*args, **kwargs)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        with self._runtime.main_process_first(local=False):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._runtime.main_process_first(local=True):
            yield

    def free_memory(self, *objects: Any) -> list[None]:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None for _ in objects]

    def end_training(self) -> None:
        self._runtime.shutdown()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"trainer.accelerator.{name}: trainwright runs on its own runtime, not accelerate; its "
            "accelerator answers device, is_main_process, is_local_main_process, process_index, "
            "local_process_index, num_processes, wait_for_everyone, gather, gather_for_metrics, reduce, "
            "unwrap_model, print, main_process_first, local_main_process_first, free_memory and end_training."
        )

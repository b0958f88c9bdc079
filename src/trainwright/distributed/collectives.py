"""accelerate's collective helpers over trainwright's runtime, for nested data: gather, gather of
Python objects, reduce, padding to the longest process, splitting inputs between processes, and the
float32 copy of half-precision outputs (of a value, or of a model's forward while in `float32_outputs`). `trainer.accelerator` answers with these; each has the
meaning of accelerate's function of the same name."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainwright.core.nested import map_tensors


def gather(runtime: Any, data: Any) -> Any:
    """Every process's tensors concatenated along dim 0 in rank order (a 0-d tensor: one row each)."""

    def one(tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat(runtime.all_gather(tensor if tensor.dim() else tensor.reshape(1)))

    return map_tensors(one, data)


def gather_object(runtime: Any, obj: Any) -> list[Any]:
    """Every process's list (or object) gathered, flattened in rank order."""
    gathered = runtime.all_gather_object(obj)
    if all(isinstance(part, (list, tuple)) for part in gathered):
        return [item for part in gathered for item in part]
    return gathered


def reduce(runtime: Any, data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """Each tensor reduced over processes ("sum", "mean" or "none"), times `scale`."""
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f"reduce(reduction={reduction!r}): expected 'sum', 'mean' or 'none'")

    def one(tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        if reduction != "none":
            runtime.all_reduce(out, reduction)
        return out * scale if scale != 1.0 else out

    return map_tensors(one, data)


def pad_across_processes(
    runtime: Any, data: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
) -> Any:
    """Each tensor padded along `dim` with `pad_index` to the longest size any process has there."""

    def one(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0 or dim >= tensor.dim() or dim < -tensor.dim():
            return tensor
        size = torch.tensor([tensor.shape[dim]], device=tensor.device)
        longest = int(runtime.all_reduce(size, "max").item())
        if tensor.shape[dim] == longest:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = longest - tensor.shape[dim]
        pad = torch.full(shape, pad_index, dtype=tensor.dtype, device=tensor.device)
        return torch.cat([pad, tensor] if pad_first else [tensor, pad], dim=dim)

    return map_tensors(one, data)


def split_between_processes(runtime: Any, inputs: Any, apply_padding: bool = False) -> Any:
    """This process's contiguous share of a list, tuple, tensor or dict of them (the first processes
    take one more when the length does not divide); `apply_padding` repeats the last element so every
    process has as many."""
    world, rank = runtime.world_size, runtime.rank
    if world == 1:
        return inputs
    if isinstance(inputs, Mapping):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) != 1:
            raise ValueError("split_between_processes: every value of the dict must have the same length")
        return {k: split_between_processes(runtime, v, apply_padding) for k, v in inputs.items()}
    if not isinstance(inputs, (list, tuple, torch.Tensor)):
        raise TypeError(
            f"split_between_processes({type(inputs).__name__}): expected a list, tuple, tensor or dict of them"
        )
    per, extra = divmod(len(inputs), world)
    start = rank * per + min(rank, extra)
    part = inputs[start : start + per + (1 if rank < extra else 0)]
    missing = per + (1 if extra else 0) - len(part)
    if not apply_padding or missing == 0:
        return part
    if isinstance(inputs, torch.Tensor):
        return torch.cat([inputs[start:], inputs[-1:].expand(missing, *inputs.shape[1:])])
    return type(part)(list(part) + [inputs[-1]] * missing)


def to_float32(data: Any) -> Any:
    """`data` with its float16 / bfloat16 tensors as float32 (accelerate's `convert_outputs_to_fp32`)."""
    return map_tensors(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t, data)


@contextlib.contextmanager
def float32_outputs(model: nn.Module) -> Iterator[None]:
    """While in it, `model`'s float16 / bfloat16 outputs come back as float32 (a forward hook)."""
    handle = model.register_forward_hook(_to_float32_hook)
    try:
        yield
    finally:
        handle.remove()


def _to_float32_hook(module: nn.Module, args: Any, output: Any) -> Any:
    return to_float32(output)

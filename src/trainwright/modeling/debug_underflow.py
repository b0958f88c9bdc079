"""`debug="underflow_overflow"`: find the first module whose weights, inputs or outputs hold inf/nan.

A forward hook on every module records a frame per call: the module's qualified name and class, and
the absolute min/max of its own parameters, its inputs and its outputs. The last
`max_frames_to_save` frames are kept; when a frame holds an inf or a nan the frames are reported
(logged, and put in the raised error) and training stops, since nothing after it means anything.
The frames before the bad one show where values grew towards the dtype's limit (transformers'
`DebugUnderflowOverflow` mode 1; `trace_batch_nums` prints whole batches without detection,
`abort_after_batch_num` stops after a batch).

Every forward reads the min/max of every tensor back to the host: it is slow, and meant for a
debugging run.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

_INDENT = " " * 17


class UnderflowOverflowError(ValueError):
    """Raised at the first inf/nan, with the report of the frames that led to it."""


def _abs_min_max(tensor: torch.Tensor) -> tuple[float, float]:
    values = tensor.detach().abs()
    if values.numel() == 0:
        return float("nan"), float("nan")
    if not values.is_floating_point():
        values = values.double()
    return values.min().item(), values.max().item()


def _has_inf_or_nan(tensor: torch.Tensor) -> bool:
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return False
    return not bool(torch.isfinite(tensor.detach()).all())


class DebugUnderflowOverflow:
    """Hook every module of `model` to detect the first inf/nan (see the module docstring).

    Args:
        model: the model to watch.
        max_frames_to_save: how many forward frames to keep and report.
        trace_batch_nums: batches (0-based) whose every frame is printed; detection is off for them.
        abort_after_batch_num: stop (raise) once this batch has finished.
    """

    def __init__(
        self,
        model: nn.Module,
        max_frames_to_save: int = 21,
        trace_batch_nums: list[int] | None = None,
        abort_after_batch_num: int | None = None,
    ):
        self.model = model
        self.trace_batch_nums = set(trace_batch_nums or [])
        self.abort_after_batch_num = abort_after_batch_num
        self.frames: collections.deque[str] = collections.deque(maxlen=max_frames_to_save)
        self.batch_number = 0
        self.detected = False
        # shared modules are reported under their first name
        self.module_names: dict[nn.Module, str] = {}
        for name, module in model.named_modules():
            self.module_names.setdefault(module, name or "(model)")
        self._handles = [m.register_forward_hook(self._forward_hook) for m in self.module_names]

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ---------------------------------------------------------------- frames
    def _describe(self, value: Any, label: str, lines: list[str]) -> None:
        if isinstance(value, torch.Tensor):
            low, high = _abs_min_max(value)
            lines.append(f"{low:8.2e} {high:8.2e} {label}")
            if _has_inf_or_nan(value):
                self.detected = True
                kinds = [k for k, bad in (("nan", torch.isnan), ("inf", torch.isinf)) if bad(value).any()]
                lines.append(f"{_INDENT} ^ {label} has {' and '.join(kinds)}")
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                self._describe(item, f"{label}[{i}]", lines)
        elif isinstance(value, dict):  # e.g. a ModelOutput
            for key, item in value.items():
                self._describe(item, f"{label}[{key!r}]", lines)
        elif value is None:
            lines.append(f"{'None':>17} {label}")
        else:
            lines.append(f"{'not a tensor':>17} {label}")

    def _frame(self, module: nn.Module, inputs: Any, output: Any) -> str:
        lines = [f"{_INDENT} {self.module_names.get(module, '?')} {type(module).__name__}"]
        for name, param in module.named_parameters(recurse=False):
            self._describe(param, name, lines)
        self._describe(inputs if isinstance(inputs, tuple) else (inputs,), "input", lines)
        self._describe(output, "output", lines)
        return "\n".join(lines)

    def _forward_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        tracing = self.batch_number in self.trace_batch_nums
        frame = self._frame(module, inputs, output)
        self.frames.append(frame)
        if tracing:
            print(frame)
        if self.detected and not tracing:
            self._report(module)
        if module is self.model:  # the outermost forward returns last: the batch is done
            self.batch_number += 1
            if self.abort_after_batch_num is not None and self.batch_number > self.abort_after_batch_num:
                raise UnderflowOverflowError(
                    f"DebugUnderflowOverflow: stopping after batch {self.batch_number - 1} "
                    f"(abort_after_batch_num={self.abort_after_batch_num})."
                )

    def _report(self, module: nn.Module) -> None:
        name = self.module_names.get(module, "?")
        report = "\n".join(
            [
                f"Detected inf/nan during batch_number={self.batch_number} in {name} ({type(module).__name__})",
                f"Last {len(self.frames)} forward frames:",
                f"{'abs min':8} {'abs max':8} metadata",
                *self.frames,
            ]
        )
        self.frames.clear()
        self.detected = False
        logger.error("%s", report)
        raise UnderflowOverflowError(
            f"debug='underflow_overflow': inf/nan in the forward of {name} ({type(module).__name__}) "
            f"at batch {self.batch_number}; training stopped. Frames leading to it:\n{report}"
        )


def watch(model: nn.Module, detector: DebugUnderflowOverflow | None) -> DebugUnderflowOverflow:
    """The detector on `model`: `detector` if it already watches it, else a new one (the old one's
    hooks are taken off), so repeated `train()` calls do not stack hooks."""
    if detector is not None and detector.model is model:
        return detector
    if detector is not None:
        detector.remove()
    return DebugUnderflowOverflow(model)

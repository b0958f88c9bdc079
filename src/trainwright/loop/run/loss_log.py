"""`LossLog`: a run's training losses between log rows, and what they say about divergence.

The unlogged steps' losses (`LossWindow`: one entry per optimizer step, read once per log row),
their reading into a log row (`window_row`) and into the running total `train_loss` averages
(`read`), every process's window for a checkpoint (`gather`), the steps without a label target
(`note_empty_step`, told by the step weights), and the first non-finite step (`Divergence`: the last
checkpoint before it is kept). The counters live in the position's `LoopCursor` (they are
checkpointed with it); the log reads them there, and holds nothing that refers back to the run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from trainwright.loop.run.divergence import Divergence

logger = logging.getLogger(__name__)


class WindowReading(NamedTuple):
    """A log window's losses, read once: their sum (averaged over processes), how many steps had a
    loss (a step without any label target has none), how many were not finite, and the offset in the
    window of the first non-finite one (None when all were finite; the earliest over processes)."""

    total: float
    counted: int
    nonfinite: int
    first_nonfinite: int | None
    filtered: int = 0  # steps whose non-finite losses `logging_nan_inf_filter` left out, none finite


class LossWindow:
    """Per-step training losses since the last log.

    Recording a step is a list append with no tensor operation and no host sync; the window is
    stacked and read once per log. On an accelerator a step's loss stays the (detached) device
    tensor the step produced. A CPU loss is kept as a Python float (reading it costs no sync there):
    holding the step's 0-d tensor would pin a small block amid the step's freed activations, and
    glibc's heap then grows by about an activation per step until the next log, paid in page faults
    (measured: +1.1 MB and ~200 page faults per GPT-2 step, ~4% of its time; see docs/design.md).
    Non-finite steps are left out of the logged mean when filtering (`logging_nan_inf_filter`),
    which is what replacing them by the running mean amounts to. A step marked empty (`mark_empty`:
    no label target in it on any process) has no loss: it is kept as None, left out of the mean.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.steps: list[torch.Tensor | float | None] = []
        self._empty = -1  # the window index of the step being recorded when it has no target

    def mark_empty(self, step: int) -> None:
        """The step at window index `step` has no label target: it records no loss."""
        self._empty = step

    def add(self, step: int, loss: torch.Tensor | float) -> None:
        if isinstance(loss, torch.Tensor) and loss.is_cpu:
            loss = loss.item()
        if step < len(self.steps):  # another micro-batch of the same optimizer step
            current = self.steps[step]
            if current is not None:
                self.steps[step] = current + loss
        else:
            self.steps.append(None if step == self._empty else loss)

    def _stacked(self, window: list) -> torch.Tensor:
        if all(type(v) is float for v in window):  # CPU losses: one tensor from the list (~10 us for 500)
            return torch.tensor(window, dtype=torch.float32, device=self.device)
        return torch.stack([torch.as_tensor(v, device=self.device).reshape(()).float() for v in window])

    def read(self, steps: int, runtime: Any, filter_nonfinite: bool) -> WindowReading:
        """The window's first `steps` steps, read (one host sync; a second collective only when a
        step was not finite), then cleared.

        With filtering, non-finite steps are replaced by the mean of the finite ones; a window with
        no finite step sums to NaN (a diverged run never reads as loss 0).
        """
        recorded = [v for v in self.steps[:steps] if v is not None]
        counted = len(recorded)
        window = self._stacked(recorded) if recorded else torch.zeros(0, device=self.device)
        finite = torch.isfinite(window)
        nonfinite = (~finite).sum().float()
        if filter_nonfinite:
            mean = torch.where(finite, window, 0.0).sum() / finite.sum()  # NaN when none is finite
            total = mean * counted if counted else window.sum()
        else:
            total = window.sum()
        reduced = runtime.all_reduce(torch.stack([total, nonfinite]), "sum")
        total_value, nonfinite_value = reduced.tolist()
        first = None
        if nonfinite_value:  # every process takes this branch: the count is reduced
            offsets = [
                i for i, v in enumerate(self.steps[:steps]) if v is not None and not math.isfinite(float(v))
            ]
            local = torch.tensor([offsets[0] if offsets else steps], device=self.device)
            first = int(runtime.all_reduce(local, "min").item())
        del self.steps[:steps]
        self._empty = -1
        return WindowReading(total_value / runtime.world_size, counted, int(nonfinite_value), first)

    def step_sum(self, steps: int, runtime: Any, filter_nonfinite: bool) -> tuple[float, int]:
        """(sum of the recorded step losses, averaged over processes; non-finite steps), then cleared."""
        reading = self.read(steps, runtime, filter_nonfinite)
        return reading.total, reading.nonfinite

    def window_sum(self, steps: int) -> torch.Tensor:
        """This process's summed step losses since the last log, as a device tensor (no sync)."""
        recorded = [v for v in self.steps[:steps] if v is not None]
        if not recorded:
            return torch.zeros((), device=self.device)
        return self._stacked(recorded).sum()

    def values(self, steps: int) -> list[float | None]:
        return [None if t is None else float(t) for t in self.steps[:steps]]

    def load(self, values: Sequence[float | None]) -> None:
        on_cpu = torch.device(self.device).type == "cpu"
        self.steps = [
            v if v is None or on_cpu else torch.tensor(v, dtype=torch.float32, device=self.device)
            for v in (None if v is None else float(v) for v in values)
        ]


class LossLog:
    """The run's step losses since the last log row (`window`), read into log rows and checkpoints.

    Built from the values it reads: the position (whose cursor holds the counters), the processes
    (`runtime`: the reading's collectives) and `logging_nan_inf_filter`."""

    __slots__ = ("window", "divergence", "position", "runtime", "filtering")

    def __init__(self, position: Any, runtime: Any, filtering: bool) -> None:
        self.window = LossWindow(runtime.device)
        self.divergence = Divergence()  # the first non-finite step, the last checkpoint before it
        self.position, self.runtime, self.filtering = position, runtime, filtering

    def continue_window(self) -> None:
        """A run starts: the unlogged losses its checkpoint saved (none for a fresh run) continue."""
        self.window.load(self.position.cursor.loss_window)

    def window_row(
        self, global_step: int, grad_norm: Any = None, learning_rate: float | None = None
    ) -> dict[str, float]:
        """The log row of the unlogged steps (read out of the window): their mean loss, the steps
        without targets or with non-finite losses, the last gradient norm and learning rate."""
        steps = self.position.cursor.steps_since_log
        reading = self.read(global_step)
        logs: dict[str, float] = {"loss": reading.total / reading.counted} if reading.counted else {}
        if reading.nonfinite:
            logs["nonfinite_steps"] = reading.nonfinite
        empty = steps - reading.counted - reading.filtered
        if empty:  # steps whose batches held no label target: no loss, no update
            logs["steps_without_targets"] = empty
        if grad_norm is not None:
            logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
        if learning_rate is not None:
            logs["learning_rate"] = float(learning_rate)
        return logs

    def read(self, global_step: int) -> WindowReading:
        """Read the unlogged steps' losses into the cursor's running total (non-finite steps are
        warned about by step, and the first is remembered: the last checkpoint before it is kept)."""
        cursor, filtering = self.position.cursor, self.filtering
        reading = self.window.read(cursor.steps_since_log, self.runtime, filtering)
        first = global_step - cursor.steps_since_log + 1
        if reading.first_nonfinite is not None:
            self.divergence.note(first + reading.first_nonfinite)
            every = not math.isfinite(reading.total)
            if not every:
                how = " (left out of the logged mean: logging_nan_inf_filter)"
            elif filtering:
                how = " (every one: filtered out by logging_nan_inf_filter, the row has no loss)"
            else:
                how = " (every one: the logged loss is NaN)"
            logger.warning(
                "Non-finite training loss in %d of the steps %d-%d%s.",
                reading.nonfinite,
                first,
                global_step,
                how,
            )
            if every and filtering:  # nothing finite to average: these steps have no loss, as empty ones
                cursor.steps_without_targets += reading.counted
                reading = reading._replace(total=0.0, counted=0, filtered=reading.counted)
        cursor.loss_logged_total += reading.total
        cursor.steps_since_log = 0
        return reading

    def gather(self, global_step: int) -> list[list[float | None]]:
        """For a checkpoint (every process calls it): every process's unlogged step losses; this
        process's go into the cursor, and a non-finite one is noted (this checkpoint is not finite)."""
        cursor = self.position.cursor
        windows = self.runtime.all_gather_object(self.window.values(cursor.steps_since_log))
        cursor.loss_window = windows[self.runtime.rank]
        offsets = [i for w in windows for i, v in enumerate(w) if v is not None and not math.isfinite(v)]
        if offsets:
            self.divergence.note(global_step - cursor.steps_since_log + 1 + min(offsets))
        return windows

    def note_empty_step(self) -> None:
        """The step being taken has no label target on any process: it records no loss."""
        cursor = self.position.cursor
        self.window.mark_empty(cursor.steps_since_log)
        cursor.steps_without_targets += 1

    def window_sum(self) -> torch.Tensor:
        """This process's summed step losses since the last log (no sync): `_maybe_log_save_evaluate`'s."""
        return self.window.window_sum(self.position.cursor.steps_since_log)

    def train_loss(self) -> float:
        """The mean loss of the run's steps that had a loss (logged windows, folded in); NaN, said
        once, when no step of the run had a label target (there is no loss to average)."""
        cursor = self.position.cursor
        counted = cursor.steps_attempted - cursor.steps_without_targets
        if cursor.steps_attempted and counted <= 0:
            logger.warning(
                "No step of this run had a label target (every label -100, or samples too short to "
                "predict a next token), so nothing was learned: train_loss is NaN."
            )
            return float("nan")
        return cursor.loss_logged_total / max(counted, 1)

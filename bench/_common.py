"""Small pieces shared by the benchmark scripts: quiet output, a step clock, summaries."""

from __future__ import annotations

import logging
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

from trainwright.events import TrainerCallback


def quiet() -> None:
    """Silence warnings and library logging so the printed table is the whole output."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("WANDB_MODE", "disabled")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass


class StepClock(TrainerCallback):
    """Timestamps optimizer step ends (one perf_counter call per step, same cost in every variant).

    `first` and `last` are the perf_counter values at the end of the first and latest step of the
    run; `steps` counts them. `probe()` is called once at the end of the first step and its result
    kept in `probed` (e.g. a dataset's call count). With `stop_after`, training stops after that
    many steps (everything after the last timestamp is outside what is measured).
    """

    def __init__(self, stop_after: int | None = None, probe: Callable[[], Any] | None = None) -> None:
        self.stop_after = stop_after
        self.probe = probe
        self.first: float | None = None
        self.last: float | None = None
        self.steps = 0
        self.probed: Any = None

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.steps += 1
        self.last = now
        if self.first is None:
            self.first = now
            if self.probe is not None:
                self.probed = self.probe()
        if self.stop_after is not None and self.steps >= self.stop_after:
            control.should_training_stop = True
        return control


def summary(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    """`median (min..max, n=N)` of a list of measurements."""
    v = [x * scale for x in values]
    return f"median {statistics.median(v):8.3f} {unit}  (min {min(v):.3f}, max {max(v):.3f}, n={len(v)})"

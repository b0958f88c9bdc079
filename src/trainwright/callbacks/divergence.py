"""Stop training when the training loss stops being finite."""

from __future__ import annotations

import logging
import math
from typing import Any

from trainwright.core.events import TrainerCallback
from trainwright.core.state import TrainerControl, TrainerState

logger = logging.getLogger(__name__)


class DivergenceCallback(TrainerCallback):
    """Stop a run whose training loss diverged (NaN or inf), without saving the diverged weights.

    Checked at each training log row: the row's `loss` and its count of non-finite steps
    (`nonfinite_steps`, which the Trainer adds to a row when some steps were NaN/inf). Training stops
    once more than `max_nonfinite_steps` steps have been non-finite in total, or at once when a row's
    loss itself is not finite (every step of its window diverged). Pass
    `callbacks=[DivergenceCallback()]` to the Trainer.
    """

    def __init__(self, max_nonfinite_steps: int = 0):
        if not isinstance(max_nonfinite_steps, int) or max_nonfinite_steps < 0:
            raise ValueError(
                f"DivergenceCallback: max_nonfinite_steps must be an int >= 0, got {max_nonfinite_steps!r}"
            )
        self.max_nonfinite_steps = max_nonfinite_steps
        self.nonfinite_steps = 0

    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl, logs: dict | None = None, **kwargs: Any
    ) -> None:
        if not logs or ("loss" not in logs and "nonfinite_steps" not in logs):
            return
        self.nonfinite_steps += int(logs.get("nonfinite_steps", 0))
        # a row whose every step diverged: its loss is NaN, or, with logging_nan_inf_filter, absent
        loss = logs.get("loss", float("nan"))
        if not math.isfinite(loss) or self.nonfinite_steps > self.max_nonfinite_steps:
            logger.error(
                "Training diverged at step %d (loss %s, %d non-finite steps so far): stopping without saving.",
                state.global_step,
                loss,
                self.nonfinite_steps,
            )
            control.should_training_stop = True
            control.should_save = False

"""`Divergence`: a run's record of its loss going non-finite, a part of the run that owns its data.

It knows the first step whose loss was not finite (found when a loss window is read into a log
row, or gathered at a save) and the newest checkpoint written before it. Rotation keeps that
checkpoint after a divergence as it keeps the best one; the end of the run names it; both facts go
into `data_state.json`, so a resumed run still knows them.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


class Divergence:
    """The first non-finite step of a run and the last checkpoint written before it."""

    def __init__(self) -> None:
        self.first_nonfinite_step: int | None = None
        self.last_finite_checkpoint: str | None = None

    def note(self, step: int) -> None:
        """Step `step` had a non-finite loss (the earliest one noted is kept)."""
        if self.first_nonfinite_step is None or step < self.first_nonfinite_step:
            self.first_nonfinite_step = step

    def checkpoint_written(self, path: str) -> None:
        """A checkpoint is being written at `path`: the last finite one while no step diverged."""
        if self.first_nonfinite_step is None:
            self.last_finite_checkpoint = path

    def kept(self) -> list[str]:
        """What rotation keeps for it: the last finite checkpoint, once the loss diverged."""
        if self.first_nonfinite_step is None or self.last_finite_checkpoint is None:
            return []
        return [self.last_finite_checkpoint]

    def state_dict(self) -> dict[str, Any]:
        """Its fields in `data_state.json`."""
        return {
            "first_nonfinite_step": self.first_nonfinite_step,
            "last_finite_checkpoint": self.last_finite_checkpoint,
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """From a checkpoint's `data_state.json` (a file of an older release lacks the fields: none)."""
        self.first_nonfinite_step = saved.get("first_nonfinite_step")
        self.last_finite_checkpoint = saved.get("last_finite_checkpoint")

    def say(self) -> None:
        """At the end of a run whose loss went non-finite: which checkpoint is the last finite one."""
        if self.first_nonfinite_step is None:
            return
        logger.warning(
            "The training loss was not finite from step %d on; the last checkpoint written before it is %s "
            "(rotation keeps it).",
            self.first_nonfinite_step,
            self.last_finite_checkpoint or "none: every checkpoint of this run came after it",
        )

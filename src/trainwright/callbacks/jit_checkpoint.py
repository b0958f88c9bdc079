"""`JITCheckpointCallback`: the preemption save under transformers' name.

transformers 5 adds a `JITCheckpointCallback` (with a `CheckpointManager` as `jit_manager`) to the
Trainer's callbacks when `enable_jit_checkpoint=True`, and code finds JIT checkpointing by looking
for that callback. trainwright's save on preemption signals is done by the loop itself
(`core/preemption.py`: finish the step, save, exit 0; on by default); this callback is its
handle under upstream's name, added in the same case (`enable_jit_checkpoint=True`, signals
handled). It runs on no event: what it reports is the loop's. Removing it does not turn the save
off: `enable_jit_checkpoint=False` or `preemption_signals=[]` does.
"""

from __future__ import annotations

from typing import Any

from trainwright.core import preemption
from trainwright.core.events import TrainerCallback


class JITCheckpointManager:
    """The preemption save of one Trainer, as `JITCheckpointCallback.jit_manager` shows it: built
    from the signals it saves on; a request is the process's (signal handlers are)."""

    def __init__(self, signals: list[str]) -> None:
        self.signals = list(signals)  # the signals that save and stop (`preemption_signals`)

    @property
    def is_checkpoint_requested(self) -> bool:
        """Whether a signal arrived during the `train()` running now: the step ends, the checkpoint
        is written, the process exits 0."""
        return preemption.requested() is not None


class JITCheckpointCallback(TrainerCallback):
    """Just-in-time checkpointing on SIGTERM (and trainwright's other `preemption_signals`).

    `trainer` and `jit_manager` are None until `set_trainer`; `jit_manager` stays None when the
    trainer's arguments handle no signal (as upstream's with `enable_jit_checkpoint=False`).
    """

    def __init__(self) -> None:
        self.trainer: Any = None
        self.jit_manager: JITCheckpointManager | None = None

    def set_trainer(self, trainer: Any) -> None:
        """Attach to `trainer` (the Trainer calls it when it adds the callback)."""
        self.trainer = trainer
        signals = trainer.args.preemption_signals
        self.jit_manager = JITCheckpointManager(signals) if signals else None


def jit_checkpoint_callbacks(args: Any) -> list[TrainerCallback]:
    """[a `JITCheckpointCallback`] when upstream adds one (`enable_jit_checkpoint=True`) and the save
    is on (signals to handle), else []; the Trainer sets itself on it (`set_trainer`), as upstream's."""
    if not (args.enable_jit_checkpoint and args.preemption_signals):
        return []
    return [JITCheckpointCallback()]

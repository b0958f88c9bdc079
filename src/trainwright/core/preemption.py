"""Save-and-stop on preemption signals (SIGTERM, SIGUSR1, SIGINT by default: `preemption_signals`).

The handler only records the request; the Trainer acts on it at the end of the current optimizer
step (an evaluation in progress stops at its next batch, its metrics discarded): it writes a
checkpoint, fires on_train_end and exits with status 0. A second SIGTERM/SIGUSR1 while that
checkpoint is being written is recorded and ignored, so it cannot interrupt the save (and the save is
atomic anyway). A second SIGINT (Ctrl-C pressed again) raises KeyboardInterrupt at once: the user
asked to abort without waiting; a checkpoint being written is then discarded (its temporary folder
removed; a background write, `async_save`, stops at its next file) and the previous one stays the
newest. Only a background write already committing its files is finished, and a warning says so.
Handlers are installed for the duration of `train()` only, and only from the main thread (Python
delivers signals there).

DataLoader workers leave these signals to the main process (`shield_worker`, run in each worker):
a scheduler (Slurm, systemd, Kubernetes) and torchrun signal the whole process group, and a worker
that died of the signal would fail the step that has to finish before the checkpoint.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterable
from types import FrameType
from typing import Any, ClassVar

logger = logging.getLogger(__name__)


class PreemptionGuard:
    """Context manager recording the first of `signal_names` received (`requested`)."""

    # the guard of the train() running now: signal handlers are the process's, one guard is in force
    current: ClassVar[PreemptionGuard | None] = None

    def __init__(self, signal_names: list[str] | None):
        self.signals = [signal.Signals[name] for name in (signal_names or [])]
        self.requested: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.requested is None:
            self.requested = sig
            logger.warning(
                "Received %s: saving a checkpoint at the end of this step, then stopping.%s",
                sig.name,
                " Press Ctrl-C again to abort without saving." if sig == signal.SIGINT else "",
            )
        elif sig == signal.SIGINT:
            logger.warning(
                "Received SIGINT again: aborting without a checkpoint; one still being written (also in the "
                "background) is discarded, the checkpoints before it are untouched."
            )
            raise KeyboardInterrupt
        else:
            logger.warning("Received %s again: already saving and stopping.", sig.name)

    def __enter__(self) -> PreemptionGuard:
        PreemptionGuard.current = self
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        elif self.signals:
            logger.info("Not in the main thread: preemption signals are not handled.")
        return self

    def __exit__(self, *exc: Any) -> None:
        if PreemptionGuard.current is self:
            PreemptionGuard.current = None
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def requested() -> signal.Signals | None:
    """The signal that asked the `train()` running now to save and stop, if one did."""
    guard = PreemptionGuard.current
    return None if guard is None else guard.requested


def shield_worker(signal_names: Iterable[str]) -> None:
    """In a DataLoader worker: ignore SIGINT and the preemption signals `signal_names`.

    The main process decides: it finishes the step (its workers still loading), saves, and shuts
    its workers down. SIGTERM from the worker's own parent is still obeyed (torch's `terminate()` of
    a worker that does not stop, which torch's handler answers by exiting): SIGTERM is then taken by a
    thread that reads the sender (`sigwaitinfo`). Without `sigwaitinfo` (macOS) it is ignored.
    """
    wanted = {"SIGINT", *signal_names}
    sigs = {signal.Signals[name] for name in wanted if hasattr(signal, name)}
    by_sender = signal.SIGTERM in sigs and hasattr(signal, "sigwaitinfo")
    for sig in sigs - ({signal.SIGTERM} if by_sender else set()):
        signal.signal(sig, signal.SIG_IGN)
    if by_sender:
        parent = multiprocessing.parent_process()  # the loader's process, also under forkserver
        # blocked here, in the worker's only thread, before the waiting thread inherits the mask
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        threading.Thread(
            target=_sigterm_from_parent_only,
            args=(parent.pid if parent is not None else os.getppid(),),
            name="trainwright-worker-sigterm",
            daemon=True,
        ).start()


def _sigterm_from_parent_only(parent_pid: int | None) -> None:
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid in (parent_pid, os.getppid()):
            os._exit(0)  # as torch's worker handler does for its parent's SIGTERM

"""The worker thread that keeps a slow or dead reporting server off the training loop.

A reporter that talks to a server (see `Reporter` in base.py) queues each event here with a
snapshot of its arguments; one thread per reporter runs them in order, and the training thread only
appends to the queue and reads two numbers. The deadline is `TRAINWRIGHT_REPORTER_TIMEOUT`.
"""

from __future__ import annotations

import atexit
import collections
import copy
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

# A reporter that talks to a server runs its events on its own worker thread (see `Reporter`).
TIMEOUT_ENV = "TRAINWRIGHT_REPORTER_TIMEOUT"
DEFAULT_TIMEOUT = 30.0  # seconds
MAX_PENDING_EVENTS = 10_000  # events queued per reporter before it is switched off
_IDLE_EXIT = 5.0  # seconds a worker waits for the next event before its thread ends


def reporter_timeout() -> float | None:
    """`TRAINWRIGHT_REPORTER_TIMEOUT` in seconds (default 30); None for "0": events of networked
    reporters then run on the training thread with no deadline, as before."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"environment variable {TIMEOUT_ENV}={raw!r}: expected a number of seconds >= 0 "
            "(0 runs reporters on the training thread without a deadline)"
        )
    return value or None


class HistoryView(Sequence):
    """`state.log_history` as it was when an event was queued: the first `n` rows of the live list
    (the trainer only appends to it while training), without copying it."""

    __slots__ = ("_rows", "_n")

    def __init__(self, rows: list, n: int) -> None:
        self._rows, self._n = rows, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self._rows[: self._n][index]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("log_history index out of range")
        return self._rows[index]

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, (list, tuple, HistoryView)) else other)

    def __repr__(self) -> str:
        return repr(list(self))

    def __deepcopy__(self, memo: dict) -> list:
        return copy.deepcopy(list(self), memo)


def snapshot(args: Sequence[Any], kwargs: dict) -> tuple[tuple, dict]:
    """An event's arguments as they are now, for a worker thread that runs it later: the state and
    control copied (the trainer changes them in place), `logs`/`metrics` copied; the model, data
    loaders and optimizer are passed as they are."""
    args = list(args)
    if len(args) > 1 and args[1] is not None:
        state = copy.copy(args[1])
        history = getattr(state, "log_history", None)
        if isinstance(history, list):
            state.log_history = HistoryView(history, len(history))
        args[1] = state
    if len(args) > 2 and args[2] is not None:
        args[2] = copy.copy(args[2])
    kwargs = dict(kwargs)
    for key in ("logs", "metrics"):
        if isinstance(kwargs.get(key), dict):
            kwargs[key] = dict(kwargs[key])
    return tuple(args), kwargs


class EventWorker:
    """One reporter's worker: a thread running its queued events in order (FIFO), started when an
    event is queued and ended after `_IDLE_EXIT` seconds without one. The training thread only
    appends to the queue and reads two numbers (`busy_since`, the queue length)."""

    def __init__(self, reporter: Any) -> None:  # a base.Reporter
        self.reporter = reporter
        self.cond = threading.Condition()
        self.tasks: collections.deque = collections.deque()
        self.thread: threading.Thread | None = None
        self.busy_since: float | None = None  # time.monotonic() when the running event started
        self.busy_event = ""
        self.completed = 0  # events finished (0: the service has not answered yet)
        self.abandoned = False  # switched off: run nothing more, clean up after the stuck call

    def put(self, task: tuple) -> bool:
        with self.cond:
            if len(self.tasks) >= MAX_PENDING_EVENTS:
                return False
            self.tasks.append(task)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._loop, name=f"trainwright-{self.reporter.name or 'reporter'}", daemon=True
                )
                self.thread.start()
            else:
                self.cond.notify()
        return True

    def stuck_for(self, now: float) -> float:
        since = self.busy_since
        return 0.0 if since is None else now - since

    def idle(self) -> bool:
        return not self.tasks and self.busy_since is None

    def abandon(self) -> int:
        """Stop running events; return how many queued ones are dropped."""
        with self.cond:
            self.abandoned = True
            dropped = len(self.tasks)
            self.tasks.clear()
            self.cond.notify_all()
        return dropped

    def _loop(self) -> None:
        reporter = self.reporter
        while True:
            with self.cond:
                if not self.tasks and not self.abandoned:
                    self.cond.wait(_IDLE_EXIT)
                if self.abandoned or not self.tasks:
                    if self.thread is threading.current_thread():
                        self.thread = None
                    return
                event, method, args, kwargs = self.tasks.popleft()
                self.busy_event = event
                self.busy_since = time.monotonic()
            try:
                reporter._run_event(event, method, args, kwargs)
            finally:
                with self.cond:
                    self.busy_since = None
                    self.completed += 1
                    abandoned = self.abandoned
                    self.cond.notify_all()
            if abandoned:  # the call the reporter was switched off for has returned at last
                try:
                    reporter.close_after_failure()
                except Exception:
                    logger.debug(
                        "%s: cleanup after switch-off failed", type(reporter).__name__, exc_info=True
                    )
                with self.cond:
                    if self.thread is threading.current_thread():
                        self.thread = None
                return


workers_to_flush: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """Events queued after training (e.g. a later evaluate()) are delivered before the process
    exits, each reporter waiting at most its deadline."""
    for reporter in list(workers_to_flush):
        try:
            reporter.flush()
        except Exception:
            logger.debug("flush at exit failed", exc_info=True)

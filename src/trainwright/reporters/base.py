"""The `Reporter` base class of the reporting integrations: rank gating, lazy set-up, the rule that
a failing reporter disables itself instead of stopping training, and where its events run (on the
training thread, or queued for its worker thread: worker.py). Shared helpers are in helpers.py and
are re-exported here, where the reporters have always imported them."""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from trainwright.core.events import EVENTS, TrainerCallback
from trainwright.core.modules import unwrap_model
from trainwright.reporters.helpers import (
    FALSE_VALUES,
    SUMMARY_KEYS,
    TRUE_VALUES,
    as_scalar,
    env_choice,
    env_flag,
    env_int,
    env_json_dict,
    export_model,
    flatten_dict,
    model_config_dict,
    rewrite_logs,
    saved_checkpoint_dir,
)
from trainwright.reporters.worker import (
    DEFAULT_TIMEOUT,
    MAX_PENDING_EVENTS,
    TIMEOUT_ENV,
    EventWorker,
    reporter_timeout,
    snapshot,
    workers_to_flush,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "FALSE_VALUES",
    "MAX_PENDING_EVENTS",
    "SUMMARY_KEYS",
    "TIMEOUT_ENV",
    "TRUE_VALUES",
    "MissingReporterPackageError",
    "Reporter",
    "as_scalar",
    "env_choice",
    "env_flag",
    "env_int",
    "env_json_dict",
    "export_model",
    "flatten_dict",
    "model_config_dict",
    "reporter_timeout",
    "rewrite_logs",
    "saved_checkpoint_dir",
    "unwrap_model",
]

logger = logging.getLogger(__name__)


class MissingReporterPackageError(ImportError):
    """A reporter was asked for but the package it talks to is not installed."""


# -- the base class ------------------------------------------------------------------------------
_inside = threading.local()  # .ids: the reporters running an event on this thread


def _running_here() -> set[int]:
    ids = getattr(_inside, "ids", None)
    if ids is None:
        ids = _inside.ids = set()
    return ids


def _guard(event: str, method: Callable) -> Callable:
    """Wrap one event: skip when disabled or not on the reporting process; queue it for the worker
    thread when the reporter talks to a server; turn an exception in the outermost call into one
    warning plus `disable()`, so training goes on without the reporter."""

    @functools.wraps(method)
    def guarded(self: Reporter, *args: Any, **kwargs: Any) -> Any:
        if self.disabled:
            return None
        if id(self) in _running_here():  # a subclass calling super(): the outer call handles failures
            return method(self, *args, **kwargs)
        state = args[1] if len(args) > 1 else kwargs.get("state")
        if state is not None and not self._is_reporting_process(state):
            return None
        if event == "on_train_begin":
            self._in_train = True
        elif event == "on_train_end":
            self._in_train = False
        if self._uses_worker():
            self._queue_event(event, method, args, kwargs)
            return None
        return self._run_event(event, method, args, kwargs)

    guarded._reporter_guarded = True  # type: ignore[attr-defined]
    return guarded


class Reporter(TrainerCallback):
    """Base class of the reporting integrations.

    Subclasses set the class attributes below and override events as usual. Every event a subclass
    defines is wrapped once (at class creation): it runs only on the reporting process (world rank 0,
    or each node's local rank 0 when `process_zero = "local"`), does nothing once the reporter is
    disabled, and an exception inside it is logged as one warning, `close_after_failure()` is
    attempted, and the reporter disables itself so that training continues.

    A slow or unreachable server never stalls training. A reporter whose `service_address()` is not
    None (the default: a reporter talks to a service unless it says it only writes local files)
    runs its events on its own worker thread, in order: the training thread copies the state and
    the logged row and returns at once. If the service does not finish one event (the first one,
    which starts the run, included) within `TRAINWRIGHT_REPORTER_TIMEOUT` seconds (default 30), or
    more than `MAX_PENDING_EVENTS` events wait, the reporter is switched off with one warning
    naming it, the server and that setting; at `on_train_end` (and at process exit) the training
    thread waits for the queued events at most that long, once; outside training (a standalone
    `evaluate()`/`predict()`) it waits so for each event, so that the event has been delivered when
    the call returns (e.g. before the user's `wandb.finish()`). `TRAINWRIGHT_REPORTER_TIMEOUT=0`
    runs every event on the training thread, unbounded, as before. Events on the worker see a
    copy of `state` (its `log_history` as it was) and of `control`; what they return is ignored,
    so a reporter cannot steer training. `_on_training_thread(event)` is called on the training
    thread before an event is queued, for what must be read there (e.g. thread-local run stacks).
    """

    name: ClassVar[str] = ""  # the report_to name
    requires: ClassVar[tuple[str, ...]] = ()  # import names of the packages the reporter talks to
    pip_name: ClassVar[str] = ""  # what to pip install
    extra: ClassVar[str | None] = None  # trainwright extra that installs it, if there is one
    process_zero: ClassVar[str] = "world"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for event in EVENTS:
            method = cls.__dict__.get(event)
            if method is not None and not getattr(method, "_reporter_guarded", False):
                setattr(cls, event, _guard(event, method))

    def __init__(self) -> None:
        type(self).require()
        self.disabled = False
        self._dropped_keys: set[str] = set()
        self.timeout = reporter_timeout()  # None: events run on the training thread
        self._worker: EventWorker | None = None
        self._worker_decided = False
        self._address: str | None = None
        self._in_train = False  # between on_train_begin and on_train_end

    # -- availability (used by the registry) -------------------------------------------------
    @classmethod
    def missing_packages(cls) -> list[str]:
        """Import names in `requires` that cannot be found."""
        missing = []
        for module in cls.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # a parent package that is absent or broken
                found = False
            if not found:
                missing.append(module)
        return missing

    @classmethod
    def install_hint(cls) -> str:
        hint = f"pip install {cls.pip_name}"
        if cls.extra:
            hint = f"pip install 'trainwright[{cls.extra}]' or {hint}"
        return hint

    @classmethod
    def require(cls) -> None:
        """Raise MissingReporterPackageError naming what to install if a package is missing."""
        missing = cls.missing_packages()
        if missing:
            raise MissingReporterPackageError(
                f"report_to={cls.name!r} needs the {', '.join(missing)} package: {cls.install_hint()}"
            )

    @classmethod
    def skip_reason(cls) -> str | None:
        """Why `report_to="all"` should leave this reporter out (it would need credentials or an
        environment it does not have), or None when it can run unattended."""
        return None

    # -- state ------------------------------------------------------------------------------
    def _is_reporting_process(self, state: Any) -> bool:
        attr = "is_local_process_zero" if self.process_zero == "local" else "is_world_process_zero"
        return bool(getattr(state, attr, True))

    # -- where events run ---------------------------------------------------------------------
    def service_address(self) -> str | None:
        """The server this reporter sends to (a URL, or a description naming the setting that
        chooses it), or None when it only writes local files in this configuration: its events then
        run on the training thread. Read once, at the first event the reporter handles."""
        return f"the {self.name or type(self).__name__} service"

    def _on_training_thread(self, event: str) -> None:
        """Called on the training thread before `event` is queued for the worker (no service calls)."""

    def _uses_worker(self) -> bool:
        if not self._worker_decided:
            self._worker_decided = True
            if self.timeout is not None:
                self._address = self.service_address()
                if self._address is not None:
                    self._worker = EventWorker(self)
        return self._worker is not None

    def _run_event(self, event: str, method: Callable, args: tuple, kwargs: dict) -> Any:
        if self.disabled:
            return None
        running = _running_here()
        running.add(id(self))
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            logger.debug("%s failed in %s", type(self).__name__, event, exc_info=True)
            self._fail(event, exc)
            return None
        finally:
            running.discard(id(self))

    def _queue_event(self, event: str, method: Callable, args: tuple, kwargs: dict) -> None:
        worker = self._worker
        assert worker is not None
        if self._check_stuck(worker, time.monotonic()):
            return
        self._on_training_thread(event)
        args, kwargs = snapshot(args, kwargs)
        if not worker.put((event, method, args, kwargs)):
            self._switch_off(
                f"{MAX_PENDING_EVENTS} events are waiting for {self._address}, which is slower than training "
                f"(now in {worker.busy_event})"
            )
            return
        workers_to_flush.add(self)
        if not self._in_train:  # the end of training, or evaluate()/predict() outside it: deliver now
            self.flush()

    def _check_stuck(self, worker: EventWorker, now: float) -> bool:
        """Switch off (True) when the running event has taken longer than the deadline."""
        assert self.timeout is not None
        if worker.stuck_for(now) <= self.timeout:
            return False
        what = "did not answer" if worker.completed else "did not answer the first call (starting the run) in"
        self._switch_off(f"{self._address} {what} {worker.busy_event} within {self.timeout:g} s")
        return True

    def _switch_off(self, why: str) -> None:
        worker = self._worker
        dropped = worker.abandon() if worker is not None else 0
        self.disable(
            f"{why}; {dropped} queued events are dropped and training continues without it (set "
            f"{TIMEOUT_ENV} to wait longer, default {DEFAULT_TIMEOUT:g} s, or to 0 to run it on the training "
            "thread without a deadline)"
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the events queued so far have run, at most `timeout` seconds (default: the
        reporter's deadline); True when they have. Past the deadline the reporter is switched off
        with one warning (it would only delay training again). No-op for reporters without a worker."""
        worker = self._worker
        if worker is None or self.disabled:
            return True
        if worker.thread is threading.current_thread():  # an event asking for it: it cannot wait on itself
            return worker.idle()
        limit = self.timeout if timeout is None else timeout
        assert limit is not None
        end = time.monotonic() + limit
        with worker.cond:
            while not worker.idle() and not worker.abandoned:
                now = time.monotonic()
                if now >= end or worker.stuck_for(now) > limit:
                    break
                worker.cond.wait(min(end - now, 0.5))
            drained = worker.idle()
        if drained or self.disabled:
            return drained
        if not self._check_stuck(worker, time.monotonic()):
            self._switch_off(
                f"{self._address} did not take the queued events within {limit:g} s (now in {worker.busy_event})"
            )
        return False

    def disable(self, reason: str, level: int = logging.WARNING) -> None:
        """Stop reporting for the rest of the run, saying why once."""
        if not self.disabled:
            logger.log(level, "The %s reporter is disabled: %s", self.name or type(self).__name__, reason)
        self.disabled = True

    def _fail(self, event: str, exc: BaseException) -> None:
        self.disable(
            f"it failed in {event} ({type(exc).__name__}: {exc}); training continues without it",
            logging.WARNING,
        )
        try:
            self.close_after_failure()
        except Exception:  # the service is likely what failed; nothing more to say
            logger.debug("%s: cleanup after failure failed too", type(self).__name__, exc_info=True)

    def close_after_failure(self) -> None:
        """Release what the reporter holds after it failed (override where there is something)."""

    def split_logs(self, logs: Mapping[str, Any]) -> tuple[dict[str, int | float], dict[str, str]]:
        """Numbers and strings of `logs`; anything else is dropped with one warning per key."""
        scalars: dict[str, int | float] = {}
        texts: dict[str, str] = {}
        for key, value in logs.items():
            number = as_scalar(value)
            if number is not None:
                scalars[key] = number
            elif isinstance(value, str):
                texts[key] = value
            else:
                self.drop_once(key, value)
        return scalars, texts

    def drop_once(self, key: str, value: Any) -> None:
        """Warn (once per key) that a logged value cannot be sent to this service."""
        if key not in self._dropped_keys:
            self._dropped_keys.add(key)
            logger.warning(
                "The %s reporter cannot log %r (a %s); it is dropped (warned once per key).",
                self.name,
                key,
                type(value).__name__,
            )


# Every reporter sees the start and end of training (a subclass that defines them is wrapped by
# __init_subclass__; these keep `_in_train` right for one that does not).
def _train_begin(self: Reporter, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
    """Nothing to report; marks the start of training."""


def _train_end(self: Reporter, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
    """Nothing to report; marks the end of training (queued events are waited for)."""


Reporter.on_train_begin = _guard("on_train_begin", _train_begin)  # type: ignore[method-assign]
Reporter.on_train_end = _guard("on_train_end", _train_end)  # type: ignore[method-assign]

"""What every reporter shares: the `Reporter` base class (rank gating, lazy set-up, the rule that a
failing reporter disables itself instead of stopping training, and the worker thread that keeps a
slow or dead server off the training loop), `rewrite_logs`, and small helpers for environment
variables, numbers, model configs and checkpoint folders."""

from __future__ import annotations

import atexit
import collections
import copy
import dataclasses
import functools
import importlib.util
import json
import logging
import math
import numbers
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from trainwright.core.events import EVENTS, TrainerCallback

logger = logging.getLogger(__name__)

TRUE_VALUES = frozenset({"1", "true", "yes", "on", "y"})
FALSE_VALUES = frozenset({"0", "false", "no", "off", "n", ""})

# Keys of the end-of-training summary row: services that have a notion of "one value per run"
# (W&B summary, ClearML single values) get these there instead of in the step history.
SUMMARY_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos"}
)


# A reporter that talks to a server runs its events on its own worker thread (see `Reporter`).
TIMEOUT_ENV = "TRAINWRIGHT_REPORTER_TIMEOUT"
DEFAULT_TIMEOUT = 30.0  # seconds
MAX_PENDING_EVENTS = 10_000  # events queued per reporter before it is switched off
_IDLE_EXIT = 5.0  # seconds a worker waits for the next event before its thread ends


class MissingReporterPackageError(ImportError):
    """A reporter was asked for but the package it talks to is not installed."""


# -- environment ---------------------------------------------------------------------------------
def env_flag(name: str, default: bool = False) -> bool:
    """Read a boolean environment variable; anything but a yes/no spelling is an error."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    raise ValueError(f"environment variable {name}={raw!r}: expected one of true/false, 1/0, yes/no, on/off")


def env_choice(
    name: str, choices: tuple[str, ...], default: str, aliases: Mapping[str, str] | None = None
) -> str:
    """Read an environment variable that must be one of `choices` (case-insensitive)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    value = (aliases or {}).get(value, value)
    if value not in choices:
        allowed = ", ".join(choices + tuple(aliases or ()))
        raise ValueError(f"environment variable {name}={raw!r}: expected one of {allowed}")
    return value


def env_int(name: str, minimum: int = 0) -> int | None:
    """Read an optional integer environment variable (>= minimum)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}={raw!r}: expected an integer >= {minimum}")
    return value


def env_json_dict(name: str) -> dict[str, Any]:
    """Read an environment variable holding a JSON object (empty dict when unset)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"environment variable {name}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"environment variable {name}: expected a JSON object, got {type(value).__name__}")
    return value


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


# -- values --------------------------------------------------------------------------------------
def as_scalar(value: Any) -> int | float | None:
    """The value as a Python int/float if it is one real number (bools count as 0/1), else None.
    Accepts numpy scalars and one-element tensors/arrays; reading a tensor syncs, which is fine at
    logging time."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    numel = getattr(value, "numel", None)
    if callable(numel):
        if numel() == 1 and not value.is_complex():
            return as_scalar(value.item())
        return None
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        return as_scalar(value.item())
    return None


def rewrite_logs(logs: Mapping[str, Any]) -> dict[str, Any]:
    """Group keys for dashboards: `eval_x` -> `eval/x`, `test_x` -> `test/x`, keys that already hold
    a `/` (e.g. the SpeedMonitor's `throughput/...`) unchanged, anything else -> `train/x`."""
    out: dict[str, Any] = {}
    for key, value in logs.items():
        if "/" in key:
            out[key] = value
        elif key.startswith("eval_"):
            out["eval/" + key[len("eval_") :]] = value
        elif key.startswith("test_"):
            out["test/" + key[len("test_") :]] = value
        else:
            out["train/" + key] = value
    return out


def flatten_dict(d: Mapping[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten_dict(value, sep, name))
        else:
            out[name] = value
    return out


# -- models and checkpoints ----------------------------------------------------------------------
def unwrap_model(model: Any) -> Any:
    """The user's module behind DDP/DataParallel and torch.compile wrappers."""
    while model is not None:
        cls = type(model).__name__
        if cls in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        elif cls == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
    return model


def model_config_dict(model: Any) -> dict[str, Any] | None:
    """The model's `config` as a dict (transformers configs, dataclasses, mappings), else None."""
    config = getattr(unwrap_model(model), "config", None)
    if config is None:
        return None
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    return None


def export_model(model: Any, directory: str) -> str:
    """Write the model's weights into `directory` (save_pretrained when the model has it, else one
    safetensors file that handles shared tensors) and return the directory."""
    model = unwrap_model(model)
    if model is None:
        raise ValueError("no model was passed to the event, so there is nothing to export")
    os.makedirs(directory, exist_ok=True)
    save_pretrained = getattr(model, "save_pretrained", None)
    if callable(save_pretrained):
        from trainwright.core.third_party import deepspeed_left_unimported

        with deepspeed_left_unimported():
            save_pretrained(directory)
    else:
        from safetensors.torch import save_model

        save_model(model, os.path.join(directory, "model.safetensors"))
    return directory


def saved_checkpoint_dir(args: Any, state: Any) -> str | None:
    """The folder the trainer has just written for `state.global_step`, or None if there is none.
    In a hyperparameter search the trainer puts trials under `output_dir/run-<trial>`."""
    name = f"checkpoint-{state.global_step}"
    candidates = [os.path.join(args.output_dir, name)]
    if getattr(state, "is_hyper_param_search", False) and getattr(state, "trial_name", None):
        trial = str(state.trial_name)
        candidates += [
            os.path.join(args.output_dir, trial, name),
            os.path.join(args.output_dir, f"run-{trial}", name),
        ]
    return next((c for c in candidates if os.path.isdir(c)), None)


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


class _HistoryView(Sequence):
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
        return list(self) == (list(other) if isinstance(other, (list, tuple, _HistoryView)) else other)

    def __repr__(self) -> str:
        return repr(list(self))

    def __deepcopy__(self, memo: dict) -> list:
        return copy.deepcopy(list(self), memo)


def _snapshot(args: Sequence[Any], kwargs: dict) -> tuple[tuple, dict]:
    """An event's arguments as they are now, for a worker thread that runs it later: the state and
    control copied (the trainer changes them in place), `logs`/`metrics` copied; the model, data
    loaders and optimizer are passed as they are."""
    args = list(args)
    if len(args) > 1 and args[1] is not None:
        state = copy.copy(args[1])
        history = getattr(state, "log_history", None)
        if isinstance(history, list):
            state.log_history = _HistoryView(history, len(history))
        args[1] = state
    if len(args) > 2 and args[2] is not None:
        args[2] = copy.copy(args[2])
    kwargs = dict(kwargs)
    for key in ("logs", "metrics"):
        if isinstance(kwargs.get(key), dict):
            kwargs[key] = dict(kwargs[key])
    return tuple(args), kwargs


class _EventWorker:
    """One reporter's worker: a thread running its queued events in order (FIFO), started when an
    event is queued and ended after `_IDLE_EXIT` seconds without one. The training thread only
    appends to the queue and reads two numbers (`busy_since`, the queue length)."""

    def __init__(self, reporter: Reporter) -> None:
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


_workers_to_flush: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """Events queued after training (e.g. a later evaluate()) are delivered before the process
    exits, each reporter waiting at most its deadline."""
    for reporter in list(_workers_to_flush):
        try:
            reporter.flush()
        except Exception:
            logger.debug("flush at exit failed", exc_info=True)


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
        self._worker: _EventWorker | None = None
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
                    self._worker = _EventWorker(self)
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
        args, kwargs = _snapshot(args, kwargs)
        if not worker.put((event, method, args, kwargs)):
            self._switch_off(
                f"{MAX_PENDING_EVENTS} events are waiting for {self._address}, which is slower than training "
                f"(now in {worker.busy_event})"
            )
            return
        _workers_to_flush.add(self)
        if not self._in_train:  # the end of training, or evaluate()/predict() outside it: deliver now
            self.flush()

    def _check_stuck(self, worker: _EventWorker, now: float) -> bool:
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

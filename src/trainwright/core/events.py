"""TrainerCallback and the handler that dispatches events to the callbacks that listen.

Event order (the loop in `trainer.py` is the spec):

    on_init_end
    on_train_begin  [evaluation if eval_on_start]
    for each epoch:
        on_epoch_begin
        for each optimizer step:
            on_step_begin
            for each micro-batch but the last: on_substep_end
            on_pre_optimizer_step, on_optimizer_step
            on_step_end
            [log: on_pre_log, on_log] [evaluate: on_prediction_step*, on_pre_log, on_log, on_evaluate]
            [save: on_save]
        on_epoch_end  [log / evaluate / save for epoch strategies]
    on_pre_log, on_log (train summary)
    on_train_end

`on_pre_log` is trainwright's own: callbacks may add keys to `logs` before the row is recorded
(the SpeedMonitor adds throughput there). Everything else is upstream's contract.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trainwright.core.state import TrainerControl, TrainerState

logger = logging.getLogger(__name__)

EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_pre_log",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
)


class TrainerCallback:
    """Base class: override the events you need. Return None to keep `control`, or a
    TrainerControl to replace it. kwargs: model, processing_class, optimizer, lr_scheduler,
    train_dataloader, eval_dataloader, cursor, plus `metrics` (on_evaluate, on_predict) and
    `logs` (on_pre_log, on_log)."""

    def on_init_end(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_epoch_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_epoch_end(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_step_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_pre_optimizer_step(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_optimizer_step(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_substep_end(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_evaluate(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_predict(self, args, state: TrainerState, control: TrainerControl, metrics, **kwargs): ...

    def on_save(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_pre_log(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_log(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_prediction_step(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...

    def on_push_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs): ...


def _overrides(callback: TrainerCallback, event: str) -> bool:
    method = getattr(type(callback), event, None)
    if method is None:
        return False
    return method is not getattr(TrainerCallback, event)


# The flags the handler clears before an event is dispatched (upstream's reset rules): plain
# assignments, not a loop of setattr calls (on_step_begin runs on every step)
def _clear_training_stop(control: TrainerControl) -> None:
    control.should_training_stop = False


def _clear_epoch_stop(control: TrainerControl) -> None:
    control.should_epoch_stop = False


def _clear_step_flags(control: TrainerControl) -> None:
    control.should_log = control.should_evaluate = control.should_save = False


def _clear_log(control: TrainerControl) -> None:
    control.should_log = False


def _clear_evaluate(control: TrainerControl) -> None:
    control.should_evaluate = False


def _clear_save(control: TrainerControl) -> None:
    control.should_save = False


_RESETS: dict[str, Callable[[TrainerControl], None]] = {
    "on_train_begin": _clear_training_stop,
    "on_epoch_begin": _clear_epoch_stop,
    "on_step_begin": _clear_step_flags,
    "on_log": _clear_log,
    "on_evaluate": _clear_evaluate,
    "on_save": _clear_save,
}


# What every callback receives besides (args, state, control), read from the handler's attributes.
_EVENT_KWARGS = (
    "model",
    "processing_class",
    "optimizer",
    "lr_scheduler",
    "train_dataloader",
    "eval_dataloader",
    "cursor",
)


# The handler's methods a library may replace (setfit assigns its own `call_event` to the instance)
_ROUTES = frozenset(("call_event", *EVENTS))
# trainwright's own events, which upstream's handler never sends through `call_event`
_OWN_EVENTS = frozenset(("on_pre_log",))


def _replaces_routes(cls: type) -> bool:
    """Whether a subclass of the handler overrides `call_event` or an `on_<event>`."""
    return any(getattr(cls, name) is not getattr(CallbackHandler, name) for name in _ROUTES)


class CallbackHandler(TrainerCallback):
    """Holds the callbacks and calls, per event, only those that override it, in list order.

    Where a library replaces `call_event` or an `on_<event>` of the handler (on its class or on the
    instance, as setfit does), every event goes through the handler's `on_<event>` and `call_event`,
    as upstream's Trainer sends them, so the replacement runs."""

    _event_kwargs: dict[str, Any] | None = None  # built on first use, dropped when one changes
    _routed = False  # call_event or an on_<event> replaced: events go through them

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _EVENT_KWARGS:
            object.__setattr__(self, "_event_kwargs", None)
        elif name in _ROUTES:
            object.__setattr__(self, "_routed", True)
            self._refresh()

    def __init__(self, callbacks, model, processing_class, optimizer, lr_scheduler):
        self.callbacks: list[TrainerCallback] = []
        self._listeners: dict[str, list[TrainerCallback]] = {}
        self._routed = type(self) is not CallbackHandler and _replaces_routes(type(self))
        for cb in callbacks or []:
            self.add_callback(cb)
        self._refresh()  # every event has its (maybe empty) list, even with no callback
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader = None
        self.eval_dataloader = None
        self.cursor = None
        if not any(type(cb).__name__ == "DefaultFlowCallback" for cb in self.callbacks):
            logger.warning(
                "The Trainer has no DefaultFlowCallback: nothing will set the log/evaluate/save flags."
            )

    @property
    def tokenizer(self):
        return self.processing_class

    # -- the list ---------------------------------------------------------------------------
    def _refresh(self) -> None:
        self._listeners = {e: [cb for cb in self.callbacks if _overrides(cb, e)] for e in EVENTS}
        # events with nothing to do: no listener and no flag to reset (the Trainer skips their call)
        quiet = (e for e, cbs in self._listeners.items() if not cbs and e not in _RESETS)
        self.quiet = frozenset() if self._routed else frozenset(quiet)

    def add_callback(self, callback) -> None:
        cb = callback() if isinstance(callback, type) else callback
        cb_class = callback if isinstance(callback, type) else type(callback)
        if any(type(c) is cb_class for c in self.callbacks):
            logger.warning(
                "You are adding a %s to the callbacks of this Trainer, but there is already one. "
                "The current list of callbacks is:\n%s",
                cb_class.__name__,
                self.callback_list,
            )
        self.callbacks.append(cb)
        self._refresh()

    def pop_callback(self, callback):
        for cb in self.callbacks:
            if (isinstance(callback, type) and isinstance(cb, callback)) or cb is callback:
                self.callbacks.remove(cb)
                self._refresh()
                return cb
        return None

    def remove_callback(self, callback) -> None:
        if isinstance(callback, type):
            for cb in self.callbacks:
                if isinstance(cb, callback):
                    self.callbacks.remove(cb)
                    break
        else:
            self.callbacks.remove(callback)
        self._refresh()

    @property
    def callback_list(self) -> str:
        return "\n".join(type(cb).__name__ for cb in self.callbacks)

    # -- dispatch ---------------------------------------------------------------------------
    def call_event(self, event: str, args, state: TrainerState, control: TrainerControl, **kwargs):
        return self._call(event, args, state, control, kwargs)

    def dispatch(
        self, event: str, args, state: TrainerState, control: TrainerControl, extra: dict | None = None
    ):
        """`call_event` with the extra keyword arguments as a dict: a call CPython can specialize
        (a `**kwargs` signature is not), which the Trainer's per-step events use. With a replaced
        `call_event` or `on_<event>`, the event goes through the handler's `on_<event>`."""
        if self._routed and event not in _OWN_EVENTS:
            return getattr(self, event)(args, state, control, **(extra or {}))
        return self._call(event, args, state, control, extra)

    def _call(self, event: str, args, state: TrainerState, control: TrainerControl, extra: dict | None):
        """Reset the event's flags, then call its listeners in order."""
        reset = _RESETS.get(event)
        if reset is not None:
            reset(control)
        listeners = self._listeners.get(event)
        if not listeners:
            return control
        kw = self._event_kwargs
        if kw is None:  # a dict per event call (not per callback) costs ~1 us on every step
            kw = self._event_kwargs = {name: getattr(self, name) for name in _EVENT_KWARGS}
        if extra:
            kw = {**kw, **extra}
        for cb in listeners:
            result = getattr(cb, event)(args, state, control, **kw)
            if result is not None:
                control = result
        return control

    def on_init_end(self, args, state, control, **kwargs):
        return self.call_event("on_init_end", args, state, control)

    # The resets come before call_event, as upstream's: a replaced call_event gets reset flags
    def on_train_begin(self, args, state, control, **kwargs):
        control.should_training_stop = False
        return self.call_event("on_train_begin", args, state, control)

    def on_train_end(self, args, state, control, **kwargs):
        return self.call_event("on_train_end", args, state, control)

    def on_epoch_begin(self, args, state, control, **kwargs):
        control.should_epoch_stop = False
        return self.call_event("on_epoch_begin", args, state, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        return self.call_event("on_epoch_end", args, state, control)

    def on_step_begin(self, args, state, control, **kwargs):
        control.should_log = control.should_evaluate = control.should_save = False
        if not self._listeners["on_step_begin"] and not self._routed:  # every step: no call_event
            return control
        return self.call_event("on_step_begin", args, state, control)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if not self._listeners["on_pre_optimizer_step"] and not self._routed:  # every step: no call
            return control
        return self.call_event("on_pre_optimizer_step", args, state, control)

    def on_optimizer_step(self, args, state, control, **kwargs):
        if not self._listeners["on_optimizer_step"] and not self._routed:  # every step: no call
            return control
        return self.call_event("on_optimizer_step", args, state, control)

    def on_substep_end(self, args, state, control, **kwargs):
        if not self._listeners["on_substep_end"] and not self._routed:  # every step: no call
            return control
        return self.call_event("on_substep_end", args, state, control)

    def on_step_end(self, args, state, control, **kwargs):
        if not self._listeners["on_step_end"] and not self._routed:  # every step: no call
            return control
        return self.call_event("on_step_end", args, state, control)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics)

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        return self.call_event("on_predict", args, state, control, metrics=metrics)

    def on_save(self, args, state, control, **kwargs):
        control.should_save = False
        return self.call_event("on_save", args, state, control)

    def on_pre_log(self, args, state, control, logs=None, **kwargs):
        return self._call("on_pre_log", args, state, control, {"logs": logs})  # not upstream's: no call_event

    def on_log(self, args, state, control, logs=None, **kwargs):
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs)

    def on_prediction_step(self, args, state, control, **kwargs):
        return self.call_event("on_prediction_step", args, state, control)

    def on_push_begin(self, args, state, control, **kwargs):
        return self.call_event("on_push_begin", args, state, control)

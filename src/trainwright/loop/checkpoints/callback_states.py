"""The callbacks' state in a checkpoint (`TrainerState.stateful_callbacks`): taken from the live
callbacks that export it, and put back into them at a resume."""

from __future__ import annotations

import logging
from typing import Any

from trainwright.core.events import CallbackHandler
from trainwright.core.state import ExportableState, TrainerControl

logger = logging.getLogger(__name__)


def callback_states(handler: CallbackHandler, control: TrainerControl) -> dict[str, Any]:
    """{ClassName: {"args", "attributes"}} of callbacks that export state, plus TrainerControl."""
    states: dict[str, Any] = {}
    for cb in [*handler.callbacks, control]:
        if not isinstance(cb, ExportableState) or not callable(getattr(cb, "state", None)):
            continue
        name = type(cb).__name__
        if name in states:
            existing = states[name]
            states[name] = [*(existing if isinstance(existing, list) else [existing]), cb.state()]
        else:
            states[name] = cb.state()
    return states


def restore_callback_states(
    handler: CallbackHandler, control: TrainerControl, saved: dict[str, Any], full: bool = False
) -> None:
    """Put saved attributes back into the live callbacks of the same class (by order for several
    of one class). With `full` (`restore_callback_states_from_checkpoint`) constructor args and the
    TrainerControl come back too, as upstream does."""
    by_class: dict[str, list] = {}
    for cb in handler.callbacks:
        by_class.setdefault(type(cb).__name__, []).append(cb)
    for name, value in saved.items():
        entries = value if isinstance(value, list) else [value]
        if name == "TrainerControl":
            if full:
                for k, v in entries[0].get("args", {}).items():
                    setattr(control, k, v)
            continue
        live = by_class.get(name, [])
        if not live:
            logger.warning("Checkpoint has state for callback %s, which this Trainer does not have.", name)
            continue
        for cb, entry in zip(live, entries):
            if full:
                new = type(cb)(**entry.get("args", {}))
                handler.remove_callback(cb)
                handler.add_callback(new)
                cb = new
            for k, v in entry.get("attributes", {}).items():
                setattr(cb, k, v)

"""The fields of a checkpoint's JSON state that a resume uses, checked before anything is loaded: a
hand edit or damage that leaves valid JSON (a `log_history` that is no list, a position that is no
count, or lies beyond this run's epoch) is refused naming the file, the field and the way forward,
instead of failing later with an error that names neither, or resuming at another place.

* `trainer_state_problems(state)`, `data_state_problems(state)`: what is wrong with the fields of a
  parsed `trainer_state.json` / `data_state.json` (types only: no run is needed);
  `STATE_FILE_CHECKS` maps each file name to its check (`verify.check_checkpoint_files` runs them);
  `TF_STATE_FILE_CHECKS` the same for a TFTrainer checkpoint (its flat `data_state.json`).
* `base_model_problems(state)`: the same for `base_model.json` (a PEFT model's checkpoint: the name
  and fingerprint of the base model its adapters were trained on).
* `check_data_state(state, folder, world_size, dataloader)`: the same for `data_state.json`, and its
  saved position within this run's epoch; raises `CheckpointError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from trainwright.checkpoint.files import BASE_MODEL_NAME, DATA_STATE_NAME, TRAINER_STATE_NAME, CheckpointError

_INT64 = 2**63  # counts, seeds and positions go to torch and numpy as 64-bit integers


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < _INT64


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field_problems(
    state: dict, fields: dict[str, tuple[Callable[[Any], bool], str]], where: str
) -> list[str]:
    return [
        f"{where}{name} is {_shown(value)} ({_kind(value)}), not {what}"
        for name, (ok, what) in fields.items()
        if name in state and not ok(value := state[name])
    ]


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


_TRAINER_STATE_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "global_step": (_is_count, "a non-negative integer"),
    "epoch": (_optional(_is_number), "a number"),
    "log_history": (
        lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v),
        "a list of objects (one per log)",
    ),
    "best_metric": (_optional(_is_number), "a number or null"),
    "best_global_step": (_optional(_is_count), "a step or null"),
    "best_model_checkpoint": (_optional(lambda v: isinstance(v, str)), "a path or null"),
    "total_flos": (_optional(_is_number), "a number"),
    "num_input_tokens_seen": (_optional(_is_number), "a number"),
    "stateful_callbacks": (_optional(lambda v: isinstance(v, dict)), "an object or null"),
    "trial_name": (_optional(lambda v: isinstance(v, str)), "a string or null"),
    "trial_params": (_optional(lambda v: isinstance(v, dict)), "an object or null"),
}


def trainer_state_problems(state: Any) -> list[str]:
    """What is wrong with the fields a resume takes from a parsed `trainer_state.json`."""
    if not isinstance(state, dict):
        return [f"{TRAINER_STATE_NAME} holds a {_kind(state)}, not a JSON object"]
    if "global_step" not in state:
        return [f"{TRAINER_STATE_NAME} has no 'global_step'"]
    return _field_problems(state, _TRAINER_STATE_FIELDS, f"{TRAINER_STATE_NAME}: ")


_COUNT = (_is_count, "a non-negative integer")
_CURSOR_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{
        name: _COUNT
        for name in (
            "epoch",
            "batch_in_epoch",
            "samples_in_epoch",
            "steps_in_epoch",
            "steps_applied",
            "steps_attempted",
            "samples_seen",
            "tokens_seen",
            "steps_since_log",
            "first_step_of_call",
        )
    },
    "flops_seen": (_is_number, "a number"),
    "loss_logged_total": (_is_number, "a number"),
    # a step without any label target has no loss: null
    "loss_window": (
        lambda v: isinstance(v, list) and all(map(_optional(_is_number), v)),
        "a list of numbers or nulls",
    ),
}
_POSITION = ("epoch", "batch_in_epoch", "samples_in_epoch")
_DATA_STATE_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "world_size": (lambda v: type(v) is int and v > 0, "a positive integer"),
    "loss_windows": (
        _optional(
            lambda v: (
                isinstance(v, list)
                and all(isinstance(w, list) and all(map(_optional(_is_number), w)) for w in v)
            )
        ),
        "a list of lists of numbers (or nulls), or null",
    ),
    "sampler": (lambda v: isinstance(v, dict), "an object"),
    "seed": (_optional(_is_count), "a seed (an integer in [0, 2**63))"),
    "dataset_fingerprint": (_optional(lambda v: isinstance(v, str)), "a string or null"),
}
# the resumable sampler's state (a sampler of another kind keeps other fields: only these are read)
_SAMPLER_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    name: (_is_count, "an integer in [0, 2**63)")
    for name in ("seed", "epoch", "start", "num_samples", "num_replicas")
}


def data_state_problems(state: Any) -> list[str]:
    """What is wrong with the fields a resume takes from a parsed `data_state.json`."""
    if not isinstance(state, dict):
        return [f"{DATA_STATE_NAME} holds a {_kind(state)}, not a JSON object"]
    cursor = state.get("cursor")
    if not isinstance(cursor, dict):
        return [f"{DATA_STATE_NAME} has no 'cursor' object (the saved position)"]
    missing = [name for name in _POSITION if name not in cursor]
    problems = [f"{DATA_STATE_NAME}: cursor has no {name!r}" for name in missing]
    problems += _field_problems(cursor, _CURSOR_FIELDS, f"{DATA_STATE_NAME}: cursor.")
    sampler = state.get("sampler")
    if isinstance(sampler, dict):
        problems += _field_problems(sampler, _SAMPLER_FIELDS, f"{DATA_STATE_NAME}: sampler.")
    return problems + _field_problems(state, _DATA_STATE_FIELDS, f"{DATA_STATE_NAME}: ")


_TF_DATA_STATE_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{
        name: _CURSOR_FIELDS[name] for name in ("epoch", "batch_in_epoch", "loss_window", "loss_logged_total")
    },
    "step_batch": (lambda v: type(v) is int and 0 < v < _INT64, "a positive integer"),
    "has_optimizer": (lambda v: isinstance(v, bool), "true or false"),
}


def tf_data_state_problems(state: Any) -> list[str]:
    """The same for the flat `data_state.json` TFTrainer writes beside its `tf_checkpoint.index`."""
    if not isinstance(state, dict):
        return [f"{DATA_STATE_NAME} holds a {_kind(state)}, not a JSON object"]
    required = [name for name in _TF_DATA_STATE_FIELDS if name != "has_optimizer"]
    problems = [f"{DATA_STATE_NAME} has no {name!r}" for name in required if name not in state]
    return problems + _field_problems(state, _TF_DATA_STATE_FIELDS, f"{DATA_STATE_NAME}: ")


_FINGERPRINT_ENTRY = re.compile(r"^[a-z0-9_]+:[0-9,]*:([0-9a-f]{2})*$")  # dtype:shape:hex of its values


def base_model_problems(state: Any) -> list[str]:
    """What is wrong with a parsed `base_model.json`: an object whose `base_model_name_or_path` is a
    string or null and whose `fingerprint` is null or maps parameter names to their entries."""
    if not isinstance(state, dict):
        return [f"{BASE_MODEL_NAME} holds a {_kind(state)}, not a JSON object"]
    problems = _field_problems(
        state,
        {
            "base_model_name_or_path": (_optional(lambda v: isinstance(v, str)), "a string"),
            "fingerprint": (_optional(lambda v: isinstance(v, dict)), "an object"),
        },
        f"{BASE_MODEL_NAME}: ",
    )
    fingerprint = state.get("fingerprint")
    if isinstance(fingerprint, dict):
        bad = [k for k, v in fingerprint.items() if not (isinstance(v, str) and _FINGERPRINT_ENTRY.match(v))]
        if bad:
            problems.append(
                f"{BASE_MODEL_NAME}: fingerprint.{bad[0]} is {_shown(fingerprint[bad[0]])}, not dtype:shape:hex"
            )
    return problems


STATE_FILE_CHECKS: dict[str, Callable[[Any], list[str]]] = {
    TRAINER_STATE_NAME: trainer_state_problems,
    DATA_STATE_NAME: data_state_problems,
    BASE_MODEL_NAME: base_model_problems,
}
TF_STATE_FILE_CHECKS: dict[str, Callable[[Any], list[str]]] = {
    **STATE_FILE_CHECKS,
    DATA_STATE_NAME: tf_data_state_problems,
}


def _length(obj: Any) -> int | None:
    try:
        return len(obj) if obj is not None else None
    except TypeError:  # an iterable dataset's loader or sampler has no length
        return None


def _position_problems(state: dict, world_size: int, dataloader: Any) -> list[str]:
    """The saved position beyond this run's epoch (micro-batches, or samples of every process)."""
    cursor, saved_world = state["cursor"], state.get("world_size", 1)
    problems = []
    batches = _length(dataloader)
    same_batches = saved_world == world_size and state.get("per_device_train_batch_size") in (
        None,
        getattr(dataloader, "batch_size", None),
    )  # in another batch geometry the position is mapped by samples (checked below)
    if batches and same_batches and cursor["batch_in_epoch"] > batches:
        problems.append(
            f"cursor.batch_in_epoch is {cursor['batch_in_epoch']}, beyond the {batches} batches of an "
            "epoch of this run"
        )
    samples = _length(getattr(dataloader, "sampler", None))
    if samples and cursor["samples_in_epoch"] * saved_world > samples * world_size:
        written = "" if saved_world == world_size else f" (per process, of {saved_world})"
        problems.append(
            f"cursor.samples_in_epoch is {cursor['samples_in_epoch']}{written}, beyond the {samples} samples "
            f"per process of an epoch of this run"
        )
    return problems


def check_data_state(state: Any, folder: str, world_size: int = 1, dataloader: Any = None) -> None:
    """Refuse a parsed `data_state.json` of checkpoint `folder` whose fields are not what a resume
    reads, or whose position lies beyond an epoch of this run's `dataloader` (`world_size`
    processes); call it unless the run restarts the saved epoch (ignore_data_skip). None (no file)
    passes."""
    if state is None:
        return
    file = os.path.join(folder, DATA_STATE_NAME)
    problems = data_state_problems(state)
    if problems:
        raise CheckpointError(
            f"Can't resume from {folder}: " + "; ".join(problems) + f". {file} was edited or damaged: "
            "resume another checkpoint."
        )
    beyond = _position_problems(state, world_size, dataloader)
    if beyond:
        raise CheckpointError(
            f"Can't resume from {folder}: {DATA_STATE_NAME}'s " + "; ".join(beyond) + f". {file} was edited, "
            "damaged or written for other data: resume another checkpoint, or pass ignore_data_skip=True to "
            "restart the saved epoch from its first batch."
        )

"""TrainerState, TrainerControl and the loop cursor: plain data with JSON round trips."""

from __future__ import annotations

import dataclasses
import math
import warnings
from abc import ABC
from dataclasses import dataclass, field
from typing import Any

from trainwright.core.files import read_json_object, write_json


# ABC only for __subclasshook__: the base has a default for each method, none is abstract.
class ExportableState(ABC):  # noqa: B024
    """A callback whose state is saved in checkpoints: `state()` and classmethod `from_state`.

    As upstream, inherit from it and implement `state()` returning {"args": constructor kwargs,
    "attributes": values to set afterwards}; `from_state` rebuilds the object from that dict. Any
    class with a `state` method also counts as one (`isinstance`), so callbacks written before this
    base class existed keep being saved."""

    def state(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} must implement state() to be saved in checkpoints")

    @classmethod
    def from_state(cls, state: dict) -> Any:
        """`cls(**state["args"])` with `state["attributes"]` set on it."""
        instance = cls(**state.get("args", {}))
        for name, value in state.get("attributes", {}).items():
            setattr(instance, name, value)
        return instance

    @classmethod
    def __subclasshook__(cls, subclass: type) -> bool:
        if cls is ExportableState:
            return callable(getattr(subclass, "state", None)) or NotImplemented
        return NotImplemented


@dataclass
class TrainerState:
    """Counters and history of a training run; everything here is derived from the loop cursor.

    The fields are upstream's, so `trainer_state.json` is the file transformers writes and reads
    (its `TrainerState(**json)` refuses any other key). trainwright's own counters are attributes,
    not fields: `optimizer_step_attempts` (optimizer steps tried, fp16 steps the scaler skipped
    included), kept in checkpoints through the loop cursor in `data_state.json`.
    """

    epoch: float | None = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, float]] = field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, Any] | None = None
    stateful_callbacks: dict[str, Any] = field(default_factory=dict)
    # not annotated, so not a field: an attribute the loop sets per instance
    optimizer_step_attempts = 0

    def __post_init__(self) -> None:
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}

    def save_to_json(self, json_path: str) -> None:
        """Write the state as sorted, indented JSON (atomically: a reader never sees half a file)."""
        write_json(json_path, dataclasses.asdict(self))

    @classmethod
    def load_from_json(cls, json_path: str) -> TrainerState:
        """Read a state written by `save_to_json` (ours, an earlier release's, or transformers');
        unknown keys are ignored with a warning."""
        data = read_json_object(json_path)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - set(_OWN_ATTRIBUTES))
        if unknown:
            warnings.warn(f"{json_path}: ignoring unknown TrainerState keys {unknown}", stacklevel=2)
        state = cls(**{k: v for k, v in data.items() if k in known})
        for name in _OWN_ATTRIBUTES:  # written into trainer_state.json by earlier releases
            if name in data:
                setattr(state, name, data[name])
        return state

    def compute_steps(self, args: Any, max_steps: int) -> None:
        """Turn logging/eval/save steps given as a ratio (< 1) into absolute step counts."""
        for name in ("logging", "eval", "save"):
            value = getattr(args, f"{name}_steps")
            if value is None:
                continue
            if value < 1:
                value = math.ceil(max_steps * value)
            setattr(self, f"{name}_steps", int(value))

    def init_training_references(
        self, trainer: Any, max_steps: int, num_train_epochs: int, trial: Any
    ) -> None:
        self.max_steps = max_steps
        self.num_train_epochs = num_train_epochs
        self.is_local_process_zero = trainer.is_local_process_zero()
        self.is_world_process_zero = trainer.is_world_process_zero()
        # a search trial's name and parameters: the Trainer records them (the search layer knows both)


# trainwright's attributes of TrainerState that earlier releases wrote into trainer_state.json
_OWN_ATTRIBUTES = ("optimizer_step_attempts",)


@dataclass
class TrainerControl(ExportableState):
    """Flags callbacks set to steer the loop; reset by the callback handler as upstream does."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict:
        return {"args": dataclasses.asdict(self), "attributes": {}}


def metric_improves(
    value: float, best: float | None, greater_is_better: bool, threshold: float = 0.0
) -> bool:
    """Whether `value` beats `best` (by more than `threshold`). A non-finite value (NaN, inf) never
    beats a recorded best, and any finite value beats a non-finite best: a diverged evaluation
    can neither win nor freeze the best metric."""
    if best is None:
        return True
    if not math.isfinite(value):
        return False
    if not math.isfinite(best):
        return True
    better = value > best if greater_is_better else value < best
    return better and abs(value - best) > threshold


@dataclass
class LoopCursor:
    """Where the training loop is. The one source of every counter in TrainerState, and what
    a checkpoint must restore for an exact resume.

    Samples, tokens and FLOPs are this process's own totals (host numbers computed from batch
    shapes: no device sync); reporters reduce them across processes when they log.
    """

    epoch: int = 0  # index of the current epoch
    batch_in_epoch: int = 0  # micro-batches consumed in the current epoch
    samples_in_epoch: int = 0  # samples consumed in the current epoch (this process)
    steps_in_epoch: int = 0  # micro-batches in an epoch (0 when the dataset has no length)
    steps_applied: int = 0  # optimizer steps that changed the weights (global_step)
    steps_attempted: int = 0  # optimizer steps tried, including fp16 steps the scaler skipped
    samples_seen: int = 0
    tokens_seen: int = 0  # input tokens, padding included
    flops_seen: float = 0.0
    steps_since_log: int = 0
    loss_window: list[float | None] = field(
        default_factory=list
    )  # step losses not yet logged (on device while training)
    loss_logged_total: float = 0.0  # sum of the loss of every logged window (for train_loss)
    first_step_of_call: int = 0  # global step at which this train() call started
    steps_without_targets: int = 0  # optimizer steps whose batches held no label target (no loss, no update)

    @property
    def fractional_epoch(self) -> float:
        if self.steps_in_epoch <= 0:
            return float(self.epoch)
        return self.epoch + self.batch_in_epoch / self.steps_in_epoch

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LoopCursor:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

"""What every hyperparameter-search backend shares: the trial's arguments, the objective, the hooks
the Trainer calls while a trial trains (run name, parameters, report of an evaluation).

The Trainer is described by a Protocol (`SearchTrainer`) so that the search layer never imports the
loop (the Trainer imports the search). Each backend keeps its own behaviour in a `Search`: how a
trial is named, which values it tried, and what a report of an evaluation does.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

# Metric keys that measure the run rather than the model; never part of the default objective.
_NOT_OBJECTIVE_SUFFIXES = ("_runtime", "_per_second", "_compilation_time")
DIRECTIONS = ("minimize", "maximize")

Objective = float | Sequence[float]


class SearchTrainer(Protocol):
    """What a search's entry reads of the Trainer: upstream's attributes and hooks only (a Protocol:
    this layer never imports the loop). The Trainer's own scope is handed in at the call."""

    args: Any
    model_init: Callable[..., Any] | None
    eval_dataset: Any
    state: Any
    callback_handler: Any

    def train(self, resume_from_checkpoint: Any = None, trial: Any = None, **kwargs: Any) -> Any: ...

    def evaluate(self) -> dict[str, float]: ...

    def add_callback(self, callback: Any) -> None: ...

    def _get_output_dir(self, trial: Any) -> str: ...


# The Trainer's search scope, handed in at `hyperparameter_search`'s call: `scope(backend, search)`
# puts the search on the Trainer while it runs and gives the caller's arguments back after.
Scope = Callable[[str, "Search"], AbstractContextManager[Any]]


@dataclasses.dataclass
class Search:
    """The running search (the Trainer keeps it while its scope is open): the user's functions and
    the backend's hooks. `report(search, trial, objective, metrics, step, stop)` hands an evaluation
    to the backend (`stop`: the Trainer's end of training, for a trial the backend stops);
    `params(trial)` gives the values a trial tries, applied to `base_args` by `trial_args`."""

    compute_objective: Callable[[dict[str, float]], Objective]
    hp_name: Callable[[Any], str] | None
    multi_objective: bool
    run_id: Callable[[Any], str]
    report: Callable[[Search, Any, Objective, dict[str, float], int, Callable[[], None]], None]
    params: Callable[[Any], dict[str, Any]] = dict
    base_args: Any = None  # the arguments every trial starts from
    warned: set[str] = dataclasses.field(default_factory=set)  # unknown hp_space keys already warned about
    reported: tuple[int, Objective] | None = None  # (global_step, objective) of the last evaluation
    pending: Any = None  # a backend's report waiting for the checkpoint of its step (Ray)

    def trial_args(self, trial: Any) -> Any:
        """The trial's arguments: `base_args` with `params(trial)` applied (`Trainer._hp_search_setup`)."""
        params = self.params(trial)
        if not isinstance(params, dict):
            raise TypeError(f"hp_space must return a dict of argument values, got {type(params).__name__}.")
        return args_for_trial(self.base_args, params, already_warned=self.warned)


# ---------------------------------------------------------------------------------- defaults
def default_compute_objective(metrics: dict[str, float]) -> float:
    """`eval_loss` when the evaluation returned no other metric, else the sum of the other metrics.

    `epoch` and the run's own measurements (`*_runtime`, `*_per_second`, `*_compilation_time`,
    `*_mem_*`) are left out; `eval_loss` is left out of the sum.
    """
    rest = {
        k: v
        for k, v in metrics.items()
        if k not in ("eval_loss", "epoch") and not k.endswith(_NOT_OBJECTIVE_SUFFIXES) and "_mem_" not in k
    }
    if not rest:
        if "eval_loss" not in metrics:
            raise ValueError(
                "default_compute_objective: the metrics have no eval_loss and no other metric to optimize "
                f"(keys: {sorted(metrics)}); pass `compute_objective`."
            )
        return float(metrics["eval_loss"])
    bad = sorted(k for k, v in rest.items() if not isinstance(v, numbers.Real))
    if bad:
        raise ValueError(
            f"default_compute_objective sums the metrics, but {bad} are not numbers; pass `compute_objective`."
        )
    return float(sum(rest.values()))


# ---------------------------------------------------------------------------------- per-trial hooks
def trial_run_name(search: Search | None, trial: Any) -> str:
    """The folder name (under output_dir) of a trial's run: `hp_name(trial)`, else `run-<trial id>`
    (optuna's trial number, Ray Tune's trial id)."""
    if search is not None and search.hp_name is not None:
        name = search.hp_name(trial)
        if not isinstance(name, str) or not name:
            raise ValueError(f"hp_name must return a non-empty string, got {name!r}.")
        return name
    if search is not None:
        return f"run-{search.run_id(trial)}"
    return f"run-{trial.number}"


def trial_params(trial: Any) -> dict[str, Any]:
    """The values the trial is trying (for `TrainerState.trial_params`; JSON-safe): optuna's
    suggestions so far, or Ray Tune's config (a dict)."""
    if isinstance(trial, dict):
        return {str(k): _plain(v) for k, v in trial.items()}
    return dict(getattr(trial, "params", None) or {})


def _plain(value: Any) -> Any:
    """A JSON-safe copy of a sampled value (numpy scalars become Python numbers)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if callable(getattr(value, "item", None)) and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def report_to_hp_search(
    search: Search | None, trial: Any, metrics: dict[str, float], step: int, stop: Callable[[], None]
) -> None:
    """Hand the objective of an evaluation at `step` to the search's backend, which may stop the
    trial (`stop`: the Trainer's end of training, called first)."""
    if search is None:
        raise RuntimeError("report_to_hp_search: no hyperparameter search is running on this trainer.")
    objective = search.compute_objective(dict(metrics))
    search.reported = (step, objective)
    if not search.multi_objective:
        check_one_number(objective)
    search.report(search, trial, objective, metrics, step, stop)


def check_one_number(objective: Any) -> float:
    """The objective as a float; a sequence (several objectives for one direction) is an error."""
    if isinstance(objective, Sequence) and not isinstance(objective, str):
        raise ValueError(
            f"compute_objective returned {objective!r}; with one direction it must return a number."
        )
    return float(objective)


# ---------------------------------------------------------------------------------- the trial's run
def args_for_trial(args: Any, params: dict[str, Any], already_warned: set[str] | None = None) -> Any:
    """A new, validated copy of `args` with `params` applied (cast to each field's current type).

    Keys that are not arguments (e.g. ones only `model_init` reads) are skipped with a warning,
    given once per key when `already_warned` is passed along from trial to trial.
    """
    fields = {f.name for f in dataclasses.fields(args) if f.init}
    warned = already_warned if already_warned is not None else set()
    unknown = sorted(k for k in params if k not in fields and k not in warned)
    warned.update(unknown)
    if unknown:
        warnings.warn(
            f"hp_space returned keys that are not {type(args).__name__} fields; skipped: {unknown}",
            stacklevel=3,
        )
    changes = {k: _cast(k, v, getattr(args, k)) for k, v in params.items() if k in fields}
    # replace() builds a new object, so __post_init__ validates the trial's combination of values
    return dataclasses.replace(args, **changes)


def _cast(name: str, value: Any, current: Any) -> Any:
    if current is None or value is None:
        return value
    if isinstance(current, bool):
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        raise ValueError(f"hp_space: {name} is a bool argument, got {value!r}.")
    if isinstance(current, int) and not isinstance(current, enum.Enum):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            return int(value)  # type: ignore[call-overload]  # typeshed's numbers.Real lacks __int__
        raise ValueError(f"hp_space: {name} is an integer argument, got {value!r}.")
    if isinstance(current, float):
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"hp_space: {name} is a float argument, got {value!r}.")
    if isinstance(current, enum.Enum) and not isinstance(value, type(current)):
        return type(current)(value)
    return value  # strings, lists, dicts: the arguments' validation checks them


def final_objective(
    search: Search, n_values: int, state: Any, args: Any, evaluate: Callable[[], dict[str, float]]
) -> tuple[float | list[float], dict[str, float] | None]:
    """The objective of the trained model (its run's `state` and `args`), and the metrics of the
    evaluation made for it with `evaluate` (None when the last report saw the final weights and is
    used as it is)."""
    reloaded = args.load_best_model_at_end and state.best_model_checkpoint is not None
    metrics: dict[str, float] | None = None
    if search.reported is not None and search.reported[0] == state.global_step and not reloaded:
        value = search.reported[1]
    else:
        metrics = dict(evaluate())
        value = search.compute_objective(dict(metrics))
        search.reported = (state.global_step, value)
    if n_values == 1:
        return check_one_number(value), metrics
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != n_values:
        raise ValueError(
            f"direction has {n_values} entries, so compute_objective must return {n_values} numbers; "
            f"it returned {value!r}."
        )
    return [float(v) for v in value], metrics


def check_direction(direction: Any) -> list[str]:
    """`direction` as a list of "minimize"/"maximize" (one per objective)."""
    values = list(direction) if isinstance(direction, (list, tuple)) else [direction]
    if not values or any(d not in DIRECTIONS for d in values):
        raise ValueError(
            f"direction must be 'minimize', 'maximize' or a list of them (one per objective), got {direction!r}."
        )
    return values

"""Hyperparameter search (`Trainer.hyperparameter_search`) with optuna.

Each trial copies the search's starting arguments, applies the trial's values to the copy (which
re-runs the arguments' validation), trains a fresh model from `model_init`, and returns the
objective computed from the evaluation metrics. Intermediate evaluations are reported to the
trial so that an optuna pruner can stop a bad trial early. Trials run one after another in one
process: they share the Trainer.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from trainwright.observe.metrics import BestRun

if TYPE_CHECKING:
    from trainwright.loop.trainer import Trainer

logger = logging.getLogger(__name__)

_DIRECTIONS = ("minimize", "maximize")
# study.optimize's options; every other keyword goes to optuna.create_study (sampler, pruner, ...).
_OPTIMIZE_KWARGS = ("timeout", "n_jobs", "gc_after_trial", "catch", "callbacks", "show_progress_bar")
_CREATE_STUDY_KWARGS = ("storage", "sampler", "pruner", "study_name", "load_if_exists")
# Metric keys that measure the run rather than the model; never part of the default objective.
_NOT_OBJECTIVE_SUFFIXES = ("_runtime", "_per_second", "_compilation_time")


@dataclasses.dataclass
class _Search:
    """What the running search needs while a trial trains (kept on the trainer as `_hp_search`)."""

    compute_objective: Callable[[dict[str, float]], float | Sequence[float]]
    hp_name: Callable[[Any], str] | None
    multi_objective: bool
    warned: set[str] = dataclasses.field(default_factory=set)  # unknown hp_space keys already warned about
    reported: tuple[int, float | Sequence[float]] | None = (
        None  # (global_step, objective) of the last evaluation
    )


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


def default_hp_space_optuna(trial: Any) -> dict[str, Any]:
    """The default optuna search space: learning rate, epochs, seed and batch size."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical(
            "per_device_train_batch_size", [4, 8, 16, 32, 64]
        ),
    }


# ---------------------------------------------------------------------------------- per-trial hooks
def trial_run_name(trainer: Trainer, trial: Any) -> str:
    """The folder name (under output_dir) of a trial's run: `hp_name(trial)`, else `run-<number>`."""
    search: _Search | None = getattr(trainer, "_hp_search", None)
    if search is not None and search.hp_name is not None:
        name = search.hp_name(trial)
        if not isinstance(name, str) or not name:
            raise ValueError(f"hp_name must return a non-empty string, got {name!r}.")
        return name
    return f"run-{trial.number}"


def trial_params(trial: Any) -> dict[str, Any]:
    """The values the trial's sampler suggested so far (for `TrainerState.trial_params`; JSON-safe,
    as optuna only suggests numbers, strings, booleans and None)."""
    return dict(getattr(trial, "params", None) or {})


def report_to_hp_search(trainer: Trainer, trial: Any, metrics: dict[str, float]) -> None:
    """Report an evaluation to the trial; stop the trial (optuna.TrialPruned) if the pruner says so."""
    search: _Search | None = getattr(trainer, "_hp_search", None)
    compute = search.compute_objective if search is not None else default_compute_objective
    objective = compute(dict(metrics))
    step = trainer.state.global_step
    if search is not None:
        search.reported = (step, objective)
    if search is not None and search.multi_objective:
        return  # optuna cannot prune (nor take intermediate values of) a multi-objective trial
    if isinstance(objective, Sequence) and not isinstance(objective, str):
        raise ValueError(
            f"compute_objective returned {objective!r}; with one direction it must return a number."
        )
    trial.report(float(cast(float, objective)), step)  # one objective: a number
    if trial.should_prune():
        optuna = _import_optuna()
        trainer.control = trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
        raise optuna.TrialPruned(f"pruned at step {step} with objective {objective}")


# ---------------------------------------------------------------------------------- the search
def run_hyperparameter_search(
    trainer: Trainer,
    hp_space: Callable[[Any], dict[str, Any]] | None = None,
    compute_objective: Callable[[dict[str, float]], float | Sequence[float]] | None = None,
    n_trials: int | None = 20,
    direction: str | list[str] = "minimize",
    backend: str | None = None,
    hp_name: Callable[[Any], str] | None = None,
    **kwargs: Any,
) -> BestRun | list[BestRun]:
    """Run `n_trials` trainings with hyperparameters from `hp_space(trial)`; return the best.

    `direction` is "minimize", "maximize" or a list of them (one per value `compute_objective`
    returns; a list of BestRun, the Pareto front, is then returned). Extra keywords: `timeout`,
    `n_jobs` (1 only), `gc_after_trial`, `catch`, `callbacks`, `show_progress_bar` go to
    `study.optimize`; `sampler`, `pruner`, `storage`, `study_name`, `load_if_exists` to
    `optuna.create_study`. Each BestRun's `run_summary` is the optuna Study.
    """
    _check_backend(backend)
    directions = _check_direction(direction)
    if trainer.model_init is None:
        raise RuntimeError(
            "hyperparameter_search needs a Trainer built with `model_init` (a function returning a fresh "
            "model), so that every trial starts from new weights."
        )
    if trainer.eval_dataset is None:
        raise ValueError(
            "hyperparameter_search needs an eval_dataset: the objective is computed from evaluation metrics."
        )
    if n_trials is not None and (isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1):
        raise ValueError(f"n_trials must be a positive integer (or None with a timeout), got {n_trials!r}.")
    unknown = sorted(set(kwargs) - set(_OPTIMIZE_KWARGS) - set(_CREATE_STUDY_KWARGS))
    if unknown:
        raise TypeError(
            f"hyperparameter_search got unknown keyword arguments {unknown}; accepted: "
            f"{sorted(_OPTIMIZE_KWARGS + _CREATE_STUDY_KWARGS)}."
        )
    if n_trials is None and kwargs.get("timeout") is None:
        raise ValueError("n_trials=None runs until `timeout`: give one of them.")
    if kwargs.get("n_jobs", 1) != 1:
        raise ValueError(
            "n_jobs must be 1: the trials share one Trainer. To run trials in parallel, start several "
            "processes on one optuna storage (`storage=..., study_name=..., load_if_exists=True`)."
        )
    if trainer.runtime.world_size > 1:
        raise NotImplementedError(
            "hyperparameter_search runs in a single process; it does not support distributed training yet."
        )
    optuna = _import_optuna()

    hp_space = hp_space or default_hp_space_optuna
    search = _Search(
        compute_objective=compute_objective or default_compute_objective,
        hp_name=hp_name,
        multi_objective=len(directions) > 1,
    )
    base_args = trainer.args

    def objective(trial: Any) -> float | list[float]:
        params = hp_space(trial)
        if not isinstance(params, dict):
            raise TypeError(f"hp_space must return a dict of argument values, got {type(params).__name__}.")
        trainer.args = args_for_trial(base_args, params, already_warned=search.warned)
        search.reported = None
        trainer.train(trial=trial)
        return _final_objective(trainer, search, len(directions))

    study_kwargs = {k: v for k, v in kwargs.items() if k in _CREATE_STUDY_KWARGS}
    optimize_kwargs = {k: v for k, v in kwargs.items() if k in _OPTIMIZE_KWARGS}
    if search.multi_objective:
        study = optuna.create_study(directions=directions, **study_kwargs)
    else:
        study = optuna.create_study(direction=directions[0], **study_kwargs)

    trainer.hp_search_backend = "optuna"
    trainer._hp_search = search
    try:
        study.optimize(objective, n_trials=n_trials, **optimize_kwargs)
    finally:
        trainer.args = base_args
        trainer.hp_search_backend = None
        trainer._hp_search = None
        trainer._trial = None

    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not completed:
        counts = {s.name.lower(): sum(t.state == s for t in study.trials) for s in optuna.trial.TrialState}
        raise RuntimeError(
            "hyperparameter_search: no trial completed "
            f"({', '.join(f'{n} {name}' for name, n in counts.items() if n)}); there is no best run."
        )
    if search.multi_objective:
        return [BestRun(str(t.number), list(t.values), trial_params(t), study) for t in study.best_trials]
    best = study.best_trial
    return BestRun(str(best.number), best.value, trial_params(best), study)


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


def _final_objective(trainer: Trainer, search: _Search, n_values: int) -> float | list[float]:
    """The objective of the trained model: the last evaluation's when it saw the final weights,
    else a fresh evaluation."""
    state, args = trainer.state, trainer.args
    reloaded = args.load_best_model_at_end and state.best_model_checkpoint is not None
    if search.reported is not None and search.reported[0] == state.global_step and not reloaded:
        value = search.reported[1]
    else:
        value = search.compute_objective(dict(trainer.evaluate()))
    if n_values == 1:
        if isinstance(value, Sequence) and not isinstance(value, str):
            raise ValueError(
                f"compute_objective returned {value!r}; with one direction it must return a number."
            )
        return float(value)
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != n_values:
        raise ValueError(
            f"direction has {n_values} entries, so compute_objective must return {n_values} numbers; "
            f"it returned {value!r}."
        )
    return [float(v) for v in value]


def _check_direction(direction: Any) -> list[str]:
    values = list(direction) if isinstance(direction, (list, tuple)) else [direction]
    if not values or any(d not in _DIRECTIONS for d in values):
        raise ValueError(
            f"direction must be 'minimize', 'maximize' or a list of them (one per objective), got {direction!r}."
        )
    return values


def _check_backend(backend: Any) -> None:
    name = getattr(backend, "value", backend)
    if name is None or name == "optuna":
        return
    if name in ("ray", "wandb", "sigopt"):
        raise ValueError(
            f"hyperparameter_search backend {name!r} is not supported: trainwright implements optuna only "
            "(pip install 'trainwright[optuna]')."
        )
    raise ValueError(f"hyperparameter_search backend must be 'optuna', got {backend!r}.")


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError as e:
        raise ImportError(
            "hyperparameter_search needs optuna: pip install optuna (or pip install 'trainwright[optuna]')."
        ) from e
    return optuna

"""Hyperparameter search (`Trainer.hyperparameter_search`): the dispatcher and the optuna backend.

Backends: "optuna" (this module) and "ray" (`ray_tune.py`, Ray Tune). Each trial copies the search's
starting arguments, applies the trial's values to the copy (which re-runs the arguments'
validation), trains a fresh model from `model_init`, and returns the objective computed from the
evaluation metrics. Intermediate evaluations are reported to the backend, so that an optuna pruner
or a Ray Tune scheduler can stop a bad trial early. Optuna's trials run one after another in this
process (they share the Trainer); Ray Tune's run in parallel in Ray worker processes.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Sequence
from typing import Any

from trainwright.loop.search.common import (
    Scope,
    Search,
    SearchTrainer,
    args_for_trial,
    check_direction,
    check_one_number,
    default_compute_objective,
    final_objective,
    report_to_hp_search,
    trial_params,
    trial_run_name,
)
from trainwright.observe.metrics import BestRun

__all__ = [
    "SUPPORTED_BACKENDS",
    "args_for_trial",
    "default_compute_objective",
    "default_hp_space_optuna",
    "report_to_hp_search",
    "run_hyperparameter_search",
    "trial_params",
    "trial_run_name",
]

logger = logging.getLogger(__name__)

_Search = Search  # the name the Trainer annotates `_hp_search` with
SUPPORTED_BACKENDS = ("optuna", "ray")
# Backends upstream lists that trainwright does not run, and why.
_UNSUPPORTED_BACKENDS = {
    "wandb": (
        "W&B sweeps are driven by the wandb server (a sweep controller hands each agent its values), "
        "which an offline run cannot reach, and trainwright does not implement the agent"
    ),
    "sigopt": (
        "SigOpt's service was shut down (transformers removed the backend) and its client cannot run "
        "a search without it"
    ),
}
# study.optimize's options; every other keyword goes to optuna.create_study (sampler, pruner, ...).
_OPTIMIZE_KWARGS = ("timeout", "n_jobs", "gc_after_trial", "catch", "callbacks", "show_progress_bar")
_CREATE_STUDY_KWARGS = ("storage", "sampler", "pruner", "study_name", "load_if_exists")


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


# ---------------------------------------------------------------------------------- the search
def run_hyperparameter_search(
    trainer: SearchTrainer,
    scope: Scope,
    hp_space: Callable[[Any], dict[str, Any]] | None = None,
    compute_objective: Callable[[dict[str, float]], float | Sequence[float]] | None = None,
    n_trials: int | None = 20,
    direction: str | list[str] = "minimize",
    backend: str | None = None,
    hp_name: Callable[[Any], str] | None = None,
    **kwargs: Any,
) -> BestRun | list[BestRun]:
    """Run `n_trials` trainings with hyperparameters from `hp_space`; return the best. `scope` is
    the Trainer's: it holds the search while it runs (handed in at the call, never kept).

    `backend`: "optuna" or "ray"; None takes optuna when it is installed, else Ray Tune.
    `direction` is "minimize", "maximize" or (optuna) a list of them, one per value
    `compute_objective` returns; a list of BestRun, the Pareto front, is then returned.

    optuna: `hp_space(trial)` suggests the values. Extra keywords: `timeout`, `n_jobs` (1 only),
    `gc_after_trial`, `catch`, `callbacks`, `show_progress_bar` go to `study.optimize`; `sampler`,
    `pruner`, `storage`, `study_name`, `load_if_exists` to `optuna.create_study`. Each BestRun's
    `run_summary` is the optuna Study.

    ray: see `trainwright.loop.search.ray_tune.run_ray_search` (`hp_space(None)` returns Ray Tune search
    spaces; `resources_per_trial`, `scheduler`, `search_alg`, `address`, ... ).
    """
    name = _resolve_backend(backend)
    directions = check_direction(direction)
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
    if trainer.args.world_size > 1:
        raise NotImplementedError(
            "hyperparameter_search runs in a single process; it does not support distributed training yet."
        )
    objective_fn = compute_objective or default_compute_objective
    if name == "ray":
        from trainwright.loop.search import ray_tune as hpo_ray

        return hpo_ray.run_ray_search(
            trainer, scope, hp_space, objective_fn, n_trials, directions, hp_name=hp_name, **kwargs
        )
    return _run_optuna(trainer, scope, hp_space, objective_fn, n_trials, directions, hp_name, kwargs)


def _run_optuna(
    trainer: SearchTrainer,
    scope: Scope,
    hp_space: Callable[[Any], dict[str, Any]] | None,
    compute_objective: Callable[[dict[str, float]], float | Sequence[float]],
    n_trials: int | None,
    directions: list[str],
    hp_name: Callable[[Any], str] | None,
    kwargs: dict[str, Any],
) -> BestRun | list[BestRun]:
    unknown = sorted(set(kwargs) - set(_OPTIMIZE_KWARGS) - set(_CREATE_STUDY_KWARGS))
    if unknown:
        raise TypeError(
            f"hyperparameter_search got unknown keyword arguments {unknown}; accepted with optuna: "
            f"{sorted(_OPTIMIZE_KWARGS + _CREATE_STUDY_KWARGS)}."
        )
    if n_trials is None and kwargs.get("timeout") is None:
        raise ValueError("n_trials=None runs until `timeout`: give one of them.")
    if kwargs.get("n_jobs", 1) != 1:
        raise ValueError(
            "n_jobs must be 1: the trials share one Trainer. To run trials in parallel, use "
            "backend='ray', or start several processes on one optuna storage "
            "(`storage=..., study_name=..., load_if_exists=True`)."
        )
    optuna = _import_optuna()

    search = Search(
        compute_objective=compute_objective,
        hp_name=hp_name,
        multi_objective=len(directions) > 1,
        run_id=lambda trial: str(trial.number),
        report=_optuna_report,
        params=hp_space or default_hp_space_optuna,
        base_args=trainer.args,
    )

    def objective(trial: Any) -> float | list[float]:
        search.reported = None
        trainer.train(trial=trial)  # its _hp_search_setup applies the trial's values (search.trial_args)
        return final_objective(search, len(directions), trainer.state, trainer.args, trainer.evaluate)[0]

    study_kwargs = {k: v for k, v in kwargs.items() if k in _CREATE_STUDY_KWARGS}
    optimize_kwargs = {k: v for k, v in kwargs.items() if k in _OPTIMIZE_KWARGS}
    if search.multi_objective:
        study = optuna.create_study(directions=directions, **study_kwargs)
    else:
        study = optuna.create_study(direction=directions[0], **study_kwargs)

    with scope("optuna", search):
        study.optimize(objective, n_trials=n_trials, **optimize_kwargs)

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


def _optuna_report(
    search: Search, trial: Any, objective: Any, metrics: dict[str, float], step: int, stop: Callable[[], None]
) -> None:
    """Report an evaluation to the optuna trial; stop the trial (`stop`, then optuna.TrialPruned) if
    the pruner says so."""
    if search.multi_objective:
        return  # optuna cannot prune (nor take intermediate values of) a multi-objective trial
    trial.report(check_one_number(objective), step)
    if trial.should_prune():
        optuna = _import_optuna()
        stop()
        raise optuna.TrialPruned(f"pruned at step {step} with objective {objective}")


def _resolve_backend(backend: Any) -> str:
    """The backend's name: the one asked for, else optuna if installed, else ray (upstream's order)."""
    name = getattr(backend, "value", backend)
    if name is None:
        for candidate, module in (("optuna", "optuna"), ("ray", "ray")):
            if _installed(module):
                return candidate
        raise ImportError(
            "hyperparameter_search needs a backend: pip install optuna (or 'trainwright[optuna]'), or "
            "pip install 'ray[tune]' (or 'trainwright[ray]')."
        )
    if name in _UNSUPPORTED_BACKENDS:
        raise ValueError(
            f"hyperparameter_search backend {name!r} is not supported: {_UNSUPPORTED_BACKENDS[name]}. "
            f"Use backend='optuna' (pip install 'trainwright[optuna]') or backend='ray' "
            "(pip install 'trainwright[ray]') instead."
        )
    if name not in SUPPORTED_BACKENDS:
        raise ValueError(
            f"hyperparameter_search backend must be one of {list(SUPPORTED_BACKENDS)}, got {backend!r}."
        )
    return str(name)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None entry in sys.modules
        return False


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError as e:
        raise ImportError(
            "hyperparameter_search needs optuna: pip install optuna (or pip install 'trainwright[optuna]')."
        ) from e
    return optuna

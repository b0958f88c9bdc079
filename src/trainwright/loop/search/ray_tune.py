"""Hyperparameter search on Ray Tune (`Trainer.hyperparameter_search(backend="ray")`).

The search connects to Ray (a local instance started for it, with this machine's CPUs and GPUs, shut
down afterwards; or an existing cluster: `address=` or `RAY_ADDRESS`), puts a copy of the Trainer
(arguments, datasets, callbacks, `model_init`; no model) into the object store with
`tune.with_parameters`, and runs `n_trials` trials through `tune.run`, as many at once as
`resources_per_trial` allows. Each trial, in a Ray worker, applies its config to a copy of the
arguments, builds its model with `model_init` and trains it. Every evaluation is reported with
`tune.report(metrics + {"objective": ...})`; when the Trainer saves a checkpoint at that step, the
report carries the checkpoint folder (`tune.Checkpoint`), so a scheduler can stop a trial (ASHA,
median stopping) or clone one (PBT): a trial Tune restores resumes exactly from its checkpoint.

On a cluster (`address="ray://..."`, `"auto"`, or `RAY_ADDRESS`), the nodes need trainwright and the
modules the Trainer's objects come from (a job's `runtime_env`), and `output_dir` and
`storage_path` on storage every node reaches. A resumed trial takes its optimizer and schedule from
the checkpoint (a PBT-mutated learning rate does not replace the restored schedule's); a mutated
batch size or accumulation is refused on resume, as for any resume.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from trainwright.checkpoint.files import PREFIX_CHECKPOINT_DIR, TRAINER_STATE_NAME
from trainwright.core.events import TrainerCallback
from trainwright.loop.search.common import (
    Scope,
    Search,
    SearchTrainer,
    check_one_number,
    final_objective,
    trial_params,
)
from trainwright.observe.metrics import BestRun

logger = logging.getLogger(__name__)

# Config keys Ray Tune's own integrations read (not Trainer arguments): left out of the arguments.
_TUNE_KEYS = ("wandb",)


def default_hp_space_ray(trial: Any = None) -> dict[str, Any]:
    """The default Ray Tune search space: learning rate, epochs, seed and batch size (upstream's;
    the seed is drawn as a whole number, as `seed` is an integer argument)."""
    tune = _import_tune()
    return {
        "learning_rate": tune.loguniform(1e-6, 1e-4),
        "num_train_epochs": tune.choice(list(range(1, 6))),
        "seed": tune.randint(1, 41),
        "per_device_train_batch_size": tune.choice([4, 8, 16, 32, 64]),
    }


def run_ray_search(
    trainer: SearchTrainer,
    scope: Scope,
    hp_space: Callable[[Any], dict[str, Any]] | None,
    compute_objective: Callable[[dict[str, float]], float | Sequence[float]],
    n_trials: int | None,
    directions: list[str],
    hp_name: Callable[[Any], str] | None = None,
    address: str | None = None,
    **kwargs: Any,
) -> BestRun:
    """Run `n_trials` trials on Ray Tune; the best (by `direction`) as a BestRun whose `run_summary`
    is Tune's `ExperimentAnalysis` and `run_id` the trial id.

    `hp_space(None)` returns the config: a dict of Tune search spaces (`tune.loguniform`, ...) or
    values (default: `default_hp_space_ray`). `model_init(trial)` and `hp_name(trial)` get the
    trial's config. Keywords go to `tune.run` as upstream: `resources_per_trial` (default 1 CPU,
    and 1 GPU when the Trainer trains on one), `scheduler`, `search_alg`, `storage_path` (default
    `<output_dir>/ray_results`), `checkpoint_config` (default: keep `save_total_limit`
    checkpoints), ...; `metric="objective"` and `mode` follow `direction` unless a scheduler or
    search algorithm names its own. `address` (or `RAY_ADDRESS`) runs on an existing cluster.
    The best trial is picked by `args.ray_scope` ("last" by default; then `RAY_SCOPE` decides).
    """
    tune = _import_tune()
    if len(directions) != 1:
        raise ValueError(
            "backend='ray' optimizes one objective: give direction='minimize' or 'maximize' "
            "(several directions, a Pareto front, need backend='optuna')."
        )
    if n_trials is None:
        raise ValueError("backend='ray' needs n_trials (Tune's num_samples).")
    mode = directions[0][:3]
    args = trainer.args
    _check_scheduler(args, kwargs.get("scheduler"))
    space = (hp_space or default_hp_space_ray)(None)
    if not isinstance(space, dict):
        raise TypeError(f"hp_space must return a dict (Ray Tune's config), got {type(space).__name__}.")
    output_dir = os.path.abspath(args.output_dir)  # workers run in their trial folders
    _tune_kwargs(tune, args, space, output_dir, mode, kwargs)
    search = Search(
        compute_objective=compute_objective,
        hp_name=hp_name,
        multi_objective=False,
        run_id=_ray_trial_id,
        report=_ray_report,
        params=_trial_params,
        base_args=args,
    )
    if args.output_dir != output_dir:
        search.base_args = copy.copy(args)  # the same validated values, the folder made absolute
        search.base_args.output_dir = output_dir
    with scope("ray", search):  # the copy the workers get holds the search, the Trainer's scope closed after
        shipped: Any = copy.copy(trainer)
        shipped.args = search.base_args
        for name in ("model", "model_wrapped", "optimizer", "lr_scheduler"):  # each trial builds its own
            setattr(shipped, name, None)
        handler = shipped.callback_handler = copy.copy(trainer.callback_handler)
        handler.callbacks = list(handler.callbacks)
        for name in ("model", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"):
            setattr(handler, name, None)
    raise_on_failed_trial = kwargs.pop("raise_on_failed_trial", True)
    started = _connect(address)
    try:
        try:  # Ray is connected: the trainer is pickled into the object store here
            trainable = tune.with_parameters(_run_shipped, shipped=(shipped, search))
        except Exception as e:
            raise RuntimeError(
                "hyperparameter_search(backend='ray') could not send the Trainer to Ray's workers: its "
                "datasets, callbacks, model_init, compute_metrics and data_collator must pickle "
                f"(cloudpickle): {type(e).__name__}: {e}"
            ) from e
        analysis = tune.run(
            trainable, config=space, num_samples=n_trials, raise_on_failed_trial=False, **kwargs
        )
    finally:
        if started:
            import ray

            ray.shutdown()
    return _best(analysis, args, mode, raise_on_failed_trial)


def _tune_kwargs(
    tune: Any, args: Any, space: dict[str, Any], output_dir: str, mode: str, kwargs: dict[str, Any]
) -> None:
    """Check `tune.run`'s keywords and fill in upstream's defaults (in place)."""
    taken = sorted(k for k in ("config", "num_samples") if k in kwargs)
    if taken:
        raise TypeError(
            f"hyperparameter_search(backend='ray') sets tune.run's {taken} itself: give the search space "
            "as hp_space and the number of samples as n_trials."
        )
    fields = {f.name for f in dataclasses.fields(args) if f.init}
    unknown = sorted(k for k in space if k not in fields and k not in _TUNE_KEYS)
    if unknown:  # said here once, not in every trial's worker log
        warnings.warn(
            f"hp_space returned keys that are not {type(args).__name__} fields; the trials' arguments skip "
            f"them (model_init(trial) still sees them in the trial's config): {unknown}",
            stacklevel=4,
        )
    kwargs.setdefault("resources_per_trial", {"cpu": 1, "gpu": 1 if args.n_gpu > 0 else 0})
    kwargs.setdefault("storage_path", os.path.join(output_dir, "ray_results"))
    if "checkpoint_config" not in kwargs and args.save_total_limit is not None:
        kwargs["checkpoint_config"] = tune.CheckpointConfig(num_to_keep=args.save_total_limit)
    if "metric" not in kwargs and "mode" not in kwargs and not _names_a_metric(kwargs):
        kwargs["metric"], kwargs["mode"] = "objective", mode


def _best(analysis: Any, args: Any, mode: str, raise_on_failed_trial: bool) -> BestRun:
    """The best trial of Tune's `analysis` (by `args.ray_scope`), failed trials refused first."""
    failed = [t for t in analysis.trials if t.status == "ERROR"]
    if failed and raise_on_failed_trial:
        raise RuntimeError(
            f"hyperparameter_search: {len(failed)} of {len(analysis.trials)} Ray Tune trials failed: "
            + "; ".join(f"{t.trial_id}: {_trial_error(t)}" for t in failed)
        )
    # the argument when set (v4), else RAY_SCOPE (v5 reads only that), else Ray's "last"
    scope = args.ray_scope if args.ray_scope not in (None, "last") else os.environ.get("RAY_SCOPE") or "last"
    reported = any("objective" in (t.last_result or {}) for t in analysis.trials)
    best = analysis.get_best_trial(metric="objective", mode=mode, scope=scope) if reported else None
    if best is None:
        states = sorted(f"{t.trial_id}: {t.status}" for t in analysis.trials)
        raise RuntimeError(f"hyperparameter_search: no trial reported an objective ({states}).")
    return BestRun(best.trial_id, best.last_result["objective"], trial_params(best.config), analysis)


# ---------------------------------------------------------------------------------- on the driver
def _trial_error(trial: Any) -> str:
    """The failed trial's exception line, and the file Tune wrote its traceback to."""
    path = getattr(trial, "error_file", None)
    if not path or not os.path.isfile(path):
        return "no error file"
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    last = next((line for line in reversed(lines) if not line.startswith(("File ", "^", "~"))), "")
    return f"{last} (traceback: {path})"


def _check_scheduler(args: Any, scheduler: Any) -> None:
    """Upstream's check: a scheduler other than FIFO acts on intermediate results, which only
    evaluations during training give; PBT also clones checkpoints, which need saving."""
    if scheduler is None or isinstance(scheduler, str):
        return
    from ray.tune.schedulers import FIFOScheduler, PopulationBasedTraining

    name = type(scheduler).__name__
    if type(scheduler) is FIFOScheduler:  # (PBT and others subclass it)
        return
    if str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "no":
        raise RuntimeError(
            f"{name} acts on intermediate results, but eval_strategy='no' reports none: set "
            "eval_strategy='steps' (with eval_steps) or 'epoch' so that trials report to Ray Tune, or "
            f"do not use {name}."
        )
    if isinstance(scheduler, PopulationBasedTraining) and str(
        getattr(args.save_strategy, "value", args.save_strategy)
    ) in ("no", "best"):
        raise RuntimeError(
            f"{name} clones the checkpoints trials report, but save_strategy={args.save_strategy!r} "
            "does not save one at each evaluation: set save_strategy (and save_steps) like eval_strategy."
        )


def _names_a_metric(kwargs: dict[str, Any]) -> bool:
    """Whether the scheduler or search algorithm passed was built with its own metric/mode (tune.run
    refuses both set there and passed to it)."""
    return any(
        getattr(obj, "metric", None) is not None or getattr(obj, "_metric", None) is not None
        for obj in (kwargs.get("scheduler"), kwargs.get("search_alg"))
        if obj is not None and not isinstance(obj, str)
    )


def _connect(address: str | None) -> bool:
    """Connect to Ray unless connected: `address` / RAY_ADDRESS, else a local instance with this
    machine's CPUs (those this process may use) and GPUs. True when this call connected."""
    import ray

    if ray.is_initialized():
        if address is not None:
            warnings.warn(
                f"hyperparameter_search(address={address!r}): Ray is already initialized in this process; "
                "the search runs on that instance.",
                stacklevel=4,
            )
        return False
    if address is not None or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address)
        return True
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ray.init(
        num_cpus=cpus,
        num_gpus=torch.cuda.device_count(),
        include_dashboard=False,
        runtime_env=_driver_path_env(),
    )
    return True


def _driver_path_env() -> dict[str, Any] | None:
    """The folders this process added to `sys.path` (a script's own modules, a test folder), for the
    workers of a local instance: the trainer they unpickle may refer to modules found there."""
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    extra = [
        os.path.abspath(p or os.getcwd())
        for p in sys.path
        if not any(os.path.realpath(p or os.getcwd()).startswith(root + os.sep) for root in installed)
    ]
    if not extra:
        return None
    current = os.environ.get("PYTHONPATH")
    paths = list(dict.fromkeys(extra + (current.split(os.pathsep) if current else [])))
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}


# ---------------------------------------------------------------------------------- in a worker
def _run_shipped(config: dict[str, Any], shipped: tuple[Any, Search]) -> None:
    """Tune's trainable: the Trainer's copy and its search come in one pickle, so that the copy's
    search (its scope's) is the one the trial reports through."""
    _run_trial(config, *shipped)


def _trial_params(trial: dict[str, Any]) -> dict[str, Any]:
    """A Tune config's argument values (the keys Tune's own integrations read left out); unknown keys
    are skipped quietly, the driver warned once for the whole search."""
    warnings.filterwarnings("ignore", message="hp_space returned keys that are not")
    return {k: v for k, v in trial.items() if k not in _TUNE_KEYS}


def _run_trial(config: dict[str, Any], trainer: Any, search: Search) -> None:
    """One Tune trial: train with the config's arguments (resuming Tune's checkpoint when Tune
    restores the trial), then report the final objective unless the last evaluation gave it."""
    tune = _import_tune()
    trial = dict(config)
    folder = trainer._get_output_dir(trial)  # upstream's hook: where the trial's checkpoints go
    trainer.add_callback(_ReportAfterSave(search, folder))
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        trainer.train(trial=trial)
    else:
        with checkpoint.as_directory() as restored:
            trainer.train(resume_from_checkpoint=checkpoint_folder(restored), trial=trial)
    _flush(search)
    objective, metrics = final_objective(search, 1, trainer.state, trainer.args, trainer.evaluate)
    if metrics is not None:  # no evaluation saw the final weights: report this one
        saved = os.path.join(folder, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
        _send({**metrics, "objective": objective}, saved if os.path.isdir(saved) else None)


def checkpoint_folder(folder: str) -> str:
    """The Trainer checkpoint in a Tune checkpoint: the folder itself, or (upstream's layout) its
    newest `checkpoint-<step>` subfolder."""
    if os.path.isfile(os.path.join(folder, TRAINER_STATE_NAME)):
        return folder
    steps = [
        (int(m.group(1)), name)
        for name in os.listdir(folder)
        if (m := re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", name))
    ]
    if not steps:
        raise ValueError(
            f"The Ray Tune checkpoint {folder} holds no Trainer checkpoint ({TRAINER_STATE_NAME})."
        )
    return os.path.join(folder, max(steps)[1])


def _ray_trial_id(trial: Any) -> str:
    return str(_import_tune().get_context().get_trial_id())


def _ray_report(
    search: Search, trial: Any, objective: Any, metrics: dict[str, float], step: int, stop: Callable[[], None]
) -> None:
    """Keep the evaluation's result until the Trainer has decided whether it saves at this step:
    `_ReportAfterSave` sends it with the checkpoint, or without one at the next event."""
    _flush(search)
    search.pending = (step, {**metrics, "objective": check_one_number(objective)})


def _flush(search: Search, checkpoint: str | None = None) -> None:
    """Send the waiting result (with `checkpoint`, the folder the Trainer saved at its step)."""
    if search.pending is None:
        return
    _, result = search.pending
    search.pending = None
    _send(result, checkpoint)


def _send(result: dict[str, Any], checkpoint: str | None) -> None:
    tune = _import_tune()
    if checkpoint is None:
        tune.report(result)
    else:
        tune.report(result, checkpoint=tune.Checkpoint.from_directory(checkpoint))


class _ReportAfterSave(TrainerCallback):
    """Sends a trial's waiting result: with the checkpoint saved at its step (under `run_dir`, the
    trial's folder), or without one at the next event when the Trainer did not save."""

    def __init__(self, search: Search, run_dir: str) -> None:
        self.search, self.run_dir = search, run_dir

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        pending = self.search.pending
        if pending is not None and pending[0] == state.global_step:
            folder = os.path.join(self.run_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            _flush(self.search, folder if os.path.isdir(folder) else None)

    def _next_event(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _flush(self.search)

    on_step_begin = on_epoch_begin = on_epoch_end = on_train_end = _next_event


def _import_tune() -> Any:
    try:
        from ray import tune
    except ImportError as e:
        raise ImportError(
            "hyperparameter_search(backend='ray') needs Ray Tune: pip install 'ray[tune]' "
            "(or pip install 'trainwright[ray]')."
        ) from e
    return tune

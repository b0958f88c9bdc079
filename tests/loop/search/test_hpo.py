"""Hyperparameter search with optuna: real studies over a tiny regression model."""

from __future__ import annotations

import json
import os
import sys
import warnings

import pytest
from conftest import RegressionDataset, RegressionModel

optuna = pytest.importorskip("optuna")

from trainwright.core.events import TrainerCallback  # noqa: E402
from trainwright.loop.search.hpo import (  # noqa: E402
    args_for_trial,
    default_compute_objective,
    default_hp_space_optuna,
    trial_run_name,
)
from trainwright.loop.trainer import Trainer  # noqa: E402
from trainwright.observe.metrics import BestRun  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Recorder(TrainerCallback):
    """Per train() call: the learning rate it ran with, its evaluations and its end."""

    def __init__(self):
        self.runs: list[dict] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.runs.append({"learning_rate": args.learning_rate, "evals": [], "ended": False})

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.runs[-1]["evals"].append((state.global_step, dict(metrics)))

    def on_train_end(self, args, state, control, **kwargs):
        self.runs[-1]["ended"] = True
        self.runs[-1]["global_step"] = state.global_step


def lr_space(trial):
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-3, 0.3, log=True)}


@pytest.fixture
def make_trainer(make_args):
    def make(**kw):
        recorder = Recorder()
        defaults = dict(
            max_steps=8,
            per_device_train_batch_size=8,
            eval_strategy="steps",
            eval_steps=4,
            logging_steps=4,
        )
        args = make_args(**{**defaults, **kw})
        trainer = Trainer(
            model_init=lambda: RegressionModel(),
            args=args,
            train_dataset=RegressionDataset(length=64),
            eval_dataset=RegressionDataset(length=32, seed=1),
            callbacks=[recorder],
        )
        return trainer, recorder

    return make


def test_search_trains_each_trial_with_its_values_and_returns_the_best(make_trainer, tmp_path):
    trainer, recorder = make_trainer(save_strategy="steps", save_steps=4)
    original_args = trainer.args
    best = trainer.hyperparameter_search(hp_space=lr_space, n_trials=3, direction="minimize")

    assert isinstance(best, BestRun)
    study = best.run_summary
    assert isinstance(study, optuna.Study) and len(study.trials) == 3
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    values = {str(t.number): t.value for t in study.trials}
    assert best.run_id == min(values, key=values.get)
    assert best.objective == min(values.values())
    assert best.hyperparameters == study.trials[int(best.run_id)].params
    assert set(best.hyperparameters) == {"learning_rate"}

    # each trial trained a fresh model with the learning rate its trial suggested, to the end
    assert len(recorder.runs) == 3
    for trial, run in zip(study.trials, recorder.runs):
        assert run["learning_rate"] == pytest.approx(trial.params["learning_rate"])
        assert run["ended"] and run["global_step"] == 8
        # the objective is the eval loss of the last evaluation (made at the final step)
        step, metrics = run["evals"][-1]
        assert step == 8 and trial.value == pytest.approx(metrics["eval_loss"])
        assert len(run["evals"]) == 2
    assert len({t.value for t in study.trials}) == 3  # different rates gave different models

    # checkpoints of trial n went to output_dir/run-n
    out = original_args.output_dir
    for trial in study.trials:
        folder = os.path.join(out, f"run-{trial.number}")
        assert sorted(os.listdir(folder)) == ["checkpoint-4", "checkpoint-8"]
    assert not any(name.startswith("checkpoint-") for name in os.listdir(out))

    # the search leaves the trainer as it found it
    assert trainer.args is original_args
    assert trainer.hp_search_backend is None


def test_trial_name_and_params_are_in_each_trials_state(make_trainer):
    trainer, _ = make_trainer(save_strategy="steps", save_steps=8)
    best = trainer.hyperparameter_search(hp_space=lr_space, n_trials=2)
    for trial in best.run_summary.trials:
        with open(
            os.path.join(trainer.args.output_dir, f"run-{trial.number}", "checkpoint-8", "trainer_state.json")
        ) as f:
            state = json.load(f)
        assert state["is_hyper_param_search"] is True
        assert state["trial_name"] == f"run-{trial.number}"
        assert state["trial_params"] == trial.params


def test_objective_comes_from_a_final_evaluation_when_training_did_not_evaluate(make_trainer):
    trainer, recorder = make_trainer(eval_strategy="no")
    seen = []

    def objective(metrics):
        seen.append(metrics)
        return metrics["eval_loss"] * 2

    best = trainer.hyperparameter_search(hp_space=lr_space, compute_objective=objective, n_trials=2)
    study = best.run_summary
    assert len(seen) == 2
    for trial, run, metrics in zip(study.trials, recorder.runs, seen):
        [(step, evaluated)] = run["evals"]  # exactly one evaluation: the one after training
        assert step == 8 and evaluated["eval_loss"] == metrics["eval_loss"]
        assert trial.value == pytest.approx(2 * metrics["eval_loss"])


def test_hp_name_names_the_trial_folders(make_trainer):
    trainer, _ = make_trainer(save_strategy="steps", save_steps=8)
    trainer.hyperparameter_search(
        hp_space=lr_space, n_trials=2, hp_name=lambda trial: f"trial_{trial.number:02d}"
    )
    out = trainer.args.output_dir
    assert sorted(d for d in os.listdir(out) if os.path.isdir(os.path.join(out, d))) == [
        "trial_00",
        "trial_01",
    ]
    assert os.listdir(os.path.join(out, "trial_01")) == ["checkpoint-8"]


def test_a_trial_the_pruner_rejects_is_stopped_early(make_trainer):
    trainer, recorder = make_trainer(max_steps=16)
    # the initial model (a=b=0) has an eval loss near 14; a tiny rate keeps it there and is pruned
    sampler = optuna.samplers.GridSampler({"learning_rate": [1e-9, 0.5]})
    pruner = optuna.pruners.ThresholdPruner(upper=5.0)
    best = trainer.hyperparameter_search(
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-9, 0.5)},
        n_trials=2,
        sampler=sampler,
        pruner=pruner,
    )
    study = best.run_summary
    states = {t.params["learning_rate"]: t.state for t in study.trials}
    assert states == {1e-9: optuna.trial.TrialState.PRUNED, 0.5: optuna.trial.TrialState.COMPLETE}
    pruned = next(t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED)
    assert list(pruned.intermediate_values) == [4]  # reported at the first evaluation, then stopped
    assert pruned.intermediate_values[4] > 5.0
    run = recorder.runs[pruned.number]
    assert run["ended"] and run["global_step"] == 4  # on_train_end fired for the pruned trial
    assert best.hyperparameters == {"learning_rate": 0.5}
    complete = study.trials[int(best.run_id)]
    assert list(complete.intermediate_values) == [4, 8, 12, 16]
    assert trainer.args.learning_rate == 5e-5  # restored


def test_multi_objective_search_returns_the_pareto_front(make_trainer):
    trainer, recorder = make_trainer()
    result = trainer.hyperparameter_search(
        hp_space=lr_space,
        # the same value minimized and maximized: every trial is on the Pareto front
        compute_objective=lambda m: [m["eval_loss"], m["eval_loss"]],
        n_trials=3,
        direction=["minimize", "maximize"],
    )
    assert isinstance(result, list) and len(result) == 3
    study = result[0].run_summary
    assert [r.run_id for r in result] == [str(t.number) for t in study.best_trials]
    for run in result:
        assert isinstance(run, BestRun) and len(run.objective) == 2
        assert run.objective == study.trials[int(run.run_id)].values
    # evaluations during training are not reported: optuna cannot prune multi-objective trials
    assert all(t.intermediate_values == {} for t in study.trials)
    assert all(len(r["evals"]) == 2 for r in recorder.runs)


def test_objective_must_match_the_number_of_directions(make_trainer):
    trainer, _ = make_trainer(eval_strategy="no")
    with pytest.raises(ValueError, match="must return 2 numbers"):
        trainer.hyperparameter_search(hp_space=lr_space, n_trials=1, direction=["minimize", "maximize"])
    assert trainer.hp_search_backend is None


def test_a_list_objective_with_one_direction_is_refused_at_the_first_evaluation(make_trainer):
    trainer, _ = make_trainer()  # evaluates during training: the objective is reported to optuna there
    with pytest.raises(ValueError, match="with one direction it must return a number"):
        trainer.hyperparameter_search(
            hp_space=lr_space, n_trials=1, compute_objective=lambda m: [m["eval_loss"]]
        )


def test_bad_requests_fail_before_any_training(make_trainer, make_args):
    trainer, recorder = make_trainer()
    with pytest.raises(ValueError, match="backend 'wandb' is not supported: W&B sweeps"):
        trainer.hyperparameter_search(hp_space=lr_space, backend="wandb")
    with pytest.raises(ValueError, match="direction must be"):
        trainer.hyperparameter_search(hp_space=lr_space, direction="down")
    with pytest.raises(ValueError, match="n_trials"):
        trainer.hyperparameter_search(hp_space=lr_space, n_trials=0)
    with pytest.raises(ValueError, match="n_jobs must be 1"):
        trainer.hyperparameter_search(hp_space=lr_space, n_jobs=2)
    with pytest.raises(TypeError, match="unknown keyword arguments \\['prunner'\\]"):
        trainer.hyperparameter_search(hp_space=lr_space, prunner=None)
    assert recorder.runs == []
    original = trainer.args
    with pytest.raises(TypeError, match="hp_space must return a dict"):
        trainer.hyperparameter_search(hp_space=lambda trial: [0.1], n_trials=1)
    assert trainer.args is original and recorder.runs == []

    plain = Trainer(model=RegressionModel(), args=make_args(), eval_dataset=RegressionDataset())
    with pytest.raises(RuntimeError, match="model_init"):
        plain.hyperparameter_search(hp_space=lr_space, n_trials=1)
    no_eval = Trainer(model_init=RegressionModel, args=make_args(), train_dataset=RegressionDataset())
    with pytest.raises(ValueError, match="eval_dataset"):
        no_eval.hyperparameter_search(hp_space=lr_space, n_trials=1)


def test_missing_optuna_names_the_install(make_trainer, monkeypatch):
    trainer, _ = make_trainer()
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r"pip install optuna.*trainwright\[optuna\]"):
        trainer.hyperparameter_search(hp_space=lr_space, n_trials=1, backend="optuna")
    # no backend named: optuna if installed, else Ray Tune, else an error naming both installs
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"needs a backend: pip install optuna.*pip install 'ray\[tune\]'"):
        trainer.hyperparameter_search(hp_space=lr_space, n_trials=1)


def test_default_compute_objective_rules():
    timing = {
        "eval_runtime": 1.5,
        "eval_samples_per_second": 10.0,
        "eval_steps_per_second": 2.0,
        "epoch": 3.0,
    }
    memory = {"eval_mem_cpu_alloc_delta": 1024, "eval_mem_cpu_peaked_delta": 2048}
    assert default_compute_objective({"eval_loss": 0.25, **timing, **memory}) == 0.25
    # other metrics present: their sum, eval_loss and run measurements left out
    metrics = {"eval_loss": 0.25, "eval_accuracy": 0.75, "eval_f1": 0.5, **timing, **memory}
    assert default_compute_objective(metrics) == pytest.approx(1.25)
    assert "eval_loss" in metrics  # the caller's dict is not changed
    with pytest.raises(ValueError, match="no eval_loss"):
        default_compute_objective(dict(timing))
    with pytest.raises(ValueError, match="not numbers"):
        default_compute_objective({"eval_loss": 1.0, "eval_label": "cat"})


def test_default_hp_space_optuna():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        space = default_hp_space_optuna(trial)
        assert set(space) == {"learning_rate", "num_train_epochs", "seed", "per_device_train_batch_size"}
        assert 1e-6 <= space["learning_rate"] <= 1e-4
        assert space["num_train_epochs"] in range(1, 6) and space["seed"] in range(1, 41)
        assert space["per_device_train_batch_size"] in (4, 8, 16, 32, 64)
    lr = trial.distributions["learning_rate"]
    assert isinstance(lr, optuna.distributions.FloatDistribution) and lr.log
    assert trial.distributions["seed"] == optuna.distributions.IntDistribution(1, 40)


def test_args_for_trial_casts_validates_and_skips_unknown_keys(make_args):
    args = make_args(learning_rate=1e-3, num_train_epochs=3.0, max_steps=-1)
    new = args_for_trial(
        args, {"learning_rate": 1, "num_train_epochs": 2, "per_device_train_batch_size": 16.0}
    )
    assert new is not args and args.learning_rate == 1e-3  # the original is untouched
    assert new.learning_rate == 1.0 and isinstance(new.learning_rate, float)
    assert new.num_train_epochs == 2.0 and isinstance(new.num_train_epochs, float)
    assert new.per_device_train_batch_size == 16 and isinstance(new.per_device_train_batch_size, int)
    assert new.output_dir == args.output_dir

    with pytest.raises(ValueError, match="per_device_train_batch_size is an integer"):
        args_for_trial(args, {"per_device_train_batch_size": 2.5})
    with pytest.raises(ValueError, match="per_device_train_batch_size"):
        args_for_trial(args, {"per_device_train_batch_size": 0})  # the arguments' own validation
    with pytest.raises(ValueError, match="fp16 is a bool"):
        args_for_trial(args, {"fp16": "yes"})

    warned: set[str] = set()
    with pytest.warns(UserWarning, match=r"skipped: \['hidden_size'\]"):
        new = args_for_trial(args, {"hidden_size": 64, "seed": 7}, already_warned=warned)
    assert new.seed == 7 and not hasattr(new, "hidden_size")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args_for_trial(args, {"hidden_size": 32}, already_warned=warned)  # warned once only


def test_trial_run_name_without_a_search_is_run_number():
    trial = optuna.create_study().ask()
    assert trial_run_name(None, trial) == f"run-{trial.number}"


def test_a_search_where_every_trial_was_pruned_says_so(make_trainer):
    trainer, _ = make_trainer()
    with pytest.raises(RuntimeError, match=r"no trial completed \(2 pruned\)"):
        trainer.hyperparameter_search(
            hp_space=lr_space, n_trials=2, pruner=optuna.pruners.ThresholdPruner(upper=0.0)
        )


def test_a_subclass_hp_search_setup_is_called_at_each_trial_train(make_trainer):
    # upstream's hook: train(trial=...) calls it first; the trial's values reach the arguments there
    trainer, recorder = make_trainer()
    seen = []

    class Hooked(type(trainer)):
        def _hp_search_setup(self, trial):
            super()._hp_search_setup(trial)
            seen.append((None if trial is None else trial.number, self.args.learning_rate))

    trainer.__class__ = Hooked
    trainer.hyperparameter_search(hp_space=lr_space, n_trials=2, backend="optuna")
    assert [n for n, _ in seen] == [0, 1]
    assert [lr for _, lr in seen] == [run["learning_rate"] for run in recorder.runs[:2]]
    base_lr = trainer.args.learning_rate
    trainer.train()  # no search: called without a trial, the caller's arguments kept
    assert seen[-1] == (None, base_lr) and trainer._hp_search is None


def test_a_search_starts_without_the_last_run(make_trainer):
    """Each trial builds its own run: the one a `train()` before the search left on the Trainer is
    dropped when the search starts (Ray ships the Trainer's copy without it)."""
    trainer, _ = make_trainer(max_steps=4)
    trainer.train()
    assert trainer._run is not None
    seen = []

    class Probe(type(trainer)):
        def _hp_search_setup(self, trial):
            seen.append(self._run)
            super()._hp_search_setup(trial)

    trainer.__class__ = Probe
    trainer.hyperparameter_search(hp_space=lr_space, n_trials=1, backend="optuna")
    assert seen == [None]

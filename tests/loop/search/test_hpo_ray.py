"""Hyperparameter search on Ray Tune: real trials in Ray worker processes over a tiny regression model.

Ray starts slowly, so the tests share one module-scoped local instance (2 CPUs), except the first,
which lets the search start (and shut down) its own.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import RegressionDataset, RegressionModel

ray = pytest.importorskip("ray")
tune = pytest.importorskip("ray.tune")

from trainwright.core.events import TrainerCallback  # noqa: E402
from trainwright.loop.search import hpo  # noqa: E402
from trainwright.loop.search import ray_tune as hpo_ray  # noqa: E402
from trainwright.loop.trainer import Trainer  # noqa: E402
from trainwright.observe.metrics import BestRun  # noqa: E402


class Journal(TrainerCallback):
    """Appends what each trial did to a JSON-lines file (the trials run in other processes)."""

    def __init__(self, path: str):
        self.path = path

    def _write(self, **row):
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def on_train_begin(self, args, state, control, **kwargs):
        context = ray.get_runtime_context()
        self._write(
            event="begin",
            time=time.time(),
            pid=os.getpid(),
            trial=tune.get_context().get_trial_id(),
            learning_rate=args.learning_rate,
            global_step=state.global_step,
            trial_name=state.trial_name,
            trial_params=state.trial_params,
            cpus=context.get_assigned_resources().get("CPU"),
        )

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._write(event="eval", trial=tune.get_context().get_trial_id(), step=state.global_step, **metrics)

    def on_train_end(self, args, state, control, **kwargs):
        self._write(
            event="end", time=time.time(), trial=tune.get_context().get_trial_id(), step=state.global_step
        )


class Rendezvous(Journal):
    """Holds each trial at its start until another trial is training too (or fails after a minute):
    trials that really run at the same time meet; trials run one after another never do. The last
    of `total` trials may find the others finished and goes on alone."""

    total = 4

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        deadline = time.time() + 60
        while time.time() < deadline:
            rows = read_journal(self.path)
            begun = sum(r["event"] == "begin" for r in rows)
            if begun - sum(r["event"] == "end" for r in rows) >= 2 or begun == self.total:
                return
            time.sleep(0.05)
        raise AssertionError("no other trial started within 60 s: the trials do not run in parallel")


def read_journal(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def most_at_once(rows) -> int:
    """The largest number of trials that were training at the same moment."""
    edges = sorted(
        (r["time"], 1 if r["event"] == "begin" else -1) for r in rows if r["event"] in ("begin", "end")
    )
    running = peak = 0
    for _, change in edges:
        running += change
        peak = max(peak, running)
    return peak


@pytest.fixture
def make_trainer(make_args, tmp_path):
    def make(journal_type=Journal, **kw):
        journal = str(tmp_path / "journal.jsonl")
        defaults = dict(
            max_steps=8,
            per_device_train_batch_size=8,
            eval_strategy="steps",
            eval_steps=4,
            save_strategy="steps",
            save_steps=4,
            output_dir=str(tmp_path / "out"),
        )
        trainer = Trainer(
            model_init=lambda: RegressionModel(),
            args=make_args(**{**defaults, **kw}),
            train_dataset=RegressionDataset(length=64),
            eval_dataset=RegressionDataset(length=32, seed=1),
            callbacks=[journal_type(journal)],
        )
        return trainer, journal

    return make


@pytest.fixture(scope="module")
def local_ray():
    """One 2-CPU Ray instance for the module; its workers see the tests' folder (conftest)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, runtime_env=hpo_ray._driver_path_env())
    yield
    ray.shutdown()


def lr_space(_):
    return {"learning_rate": tune.loguniform(1e-3, 0.3)}


def test_a_search_starts_ray_with_the_machines_cpus_honours_resources_and_shuts_it_down(
    make_trainer, tmp_path
):
    assert not ray.is_initialized()
    trainer, journal = make_trainer(save_strategy="no")
    best = trainer.hyperparameter_search(
        backend="ray",
        hp_space=lambda _: {"learning_rate": tune.grid_search([0.01, 0.1])},
        n_trials=1,
        resources_per_trial={"cpu": 2},
        reuse_actors=True,
        verbose=0,
    )
    assert not ray.is_initialized()  # started for the search, shut down after it
    rows = read_journal(journal)
    begins = [r for r in rows if r["event"] == "begin"]
    assert len(begins) == 2 and all(r["cpus"] == 2 for r in begins)
    assert most_at_once(rows) == 1  # 2 CPUs per trial on this instance: one trial at a time
    trials = best.run_summary.trials
    assert len(trials) == 2 and all(t.status == "TERMINATED" for t in trials)
    assert trials[0].placement_group_factory.required_resources.get("CPU") == 2
    assert best.run_summary.experiment_path.startswith(str(tmp_path / "out" / "ray_results"))


def test_unsupported_backends_and_bad_requests_fail_before_ray_starts(make_trainer):
    trainer, _ = make_trainer()
    with pytest.raises(
        ValueError, match="W&B sweeps are driven by the wandb server.*backend='optuna'.*backend='ray'"
    ):
        trainer.hyperparameter_search(backend="wandb")
    with pytest.raises(ValueError, match="SigOpt.*backend='optuna'.*backend='ray'"):
        trainer.hyperparameter_search(backend="sigopt")
    with pytest.raises(ValueError, match=r"must be one of \['optuna', 'ray'\], got 'hyperopt'"):
        trainer.hyperparameter_search(backend="hyperopt")
    with pytest.raises(ValueError, match="Pareto front, need backend='optuna'"):
        trainer.hyperparameter_search(backend="ray", hp_space=lr_space, direction=["minimize", "maximize"])
    no_eval, _ = make_trainer(eval_strategy="no", save_strategy="no")
    with pytest.raises(
        RuntimeError, match="AsyncHyperBandScheduler acts on intermediate results.*eval_strategy"
    ):
        no_eval.hyperparameter_search(
            backend="ray", hp_space=lr_space, scheduler=tune.schedulers.ASHAScheduler()
        )
    no_save, _ = make_trainer(save_strategy="no")
    with pytest.raises(RuntimeError, match="PopulationBasedTraining clones the checkpoints"):
        no_save.hyperparameter_search(
            backend="ray",
            hp_space=lr_space,
            scheduler=tune.schedulers.PopulationBasedTraining(hyperparam_mutations={"learning_rate": [0.1]}),
        )
    with pytest.raises(TypeError, match="hp_space must return a dict"):
        trainer.hyperparameter_search(backend="ray", hp_space=lambda _: [0.1])
    with pytest.raises(TypeError, match=r"sets tune.run's \['num_samples'\] itself.*n_trials"):
        trainer.hyperparameter_search(backend="ray", hp_space=lr_space, num_samples=3)
    assert not ray.is_initialized()


def test_backend_none_prefers_optuna_then_ray(monkeypatch):
    assert hpo._resolve_backend(None) == "optuna"
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)
    assert hpo._resolve_backend(None) == "ray"
    assert hpo._resolve_backend("ray") == "ray"


def test_default_hp_space_ray_samples_whole_seeds_and_upstreams_ranges():
    space = hpo_ray.default_hp_space_ray(None)
    assert set(space) == {"learning_rate", "num_train_epochs", "seed", "per_device_train_batch_size"}
    for _ in range(20):
        lr = space["learning_rate"].sample()
        seed = space["seed"].sample()
        assert 1e-6 <= lr <= 1e-4
        assert int(seed) == seed and 1 <= seed <= 40
        assert space["num_train_epochs"].sample() in range(1, 6)
        assert space["per_device_train_batch_size"].sample() in (4, 8, 16, 32, 64)


def test_the_trainer_shipped_to_workers_has_no_model_and_an_absolute_output_dir(
    make_trainer, tmp_path, monkeypatch
):
    # what run_ray_search hands to tune.with_parameters, caught there (Ray is never started)
    monkeypatch.chdir(tmp_path)
    trainer, _ = make_trainer(output_dir="relative_out")
    sent = {}

    def with_parameters(trainable, **kwargs):
        sent.update(kwargs)
        raise RuntimeError("caught")

    monkeypatch.setattr(hpo_ray, "_connect", lambda address: False)
    monkeypatch.setattr(hpo_ray._import_tune(), "with_parameters", with_parameters)
    with pytest.raises(RuntimeError, match="could not send the Trainer"):
        trainer.hyperparameter_search(backend="ray", hp_space=lambda _: {"seed": 3}, n_trials=1)
    shipped, search = sent["shipped"]
    assert shipped.model is None and shipped.optimizer is None and shipped.callback_handler.model is None
    assert shipped.args.output_dir == str(tmp_path / "relative_out")  # trials run in Tune's trial folders
    assert search.base_args is shipped.args
    # the copy holds the search as the Trainer's scope put it (one pickle: the same object in a worker)
    assert shipped.hp_search_backend == "ray" and shipped._hp_search is search
    # the caller's trainer is unchanged, its scope closed
    assert trainer.model is not None and trainer.args.output_dir == "relative_out"
    assert trainer.hp_search_backend is None and trainer.callback_handler is not shipped.callback_handler
    assert trainer._hp_search is None


def test_checkpoint_folder_finds_the_trainer_checkpoint(tmp_path):
    direct = tmp_path / "direct"
    direct.mkdir()
    (direct / "trainer_state.json").write_text('{"global_step": 0}')
    assert hpo_ray.checkpoint_folder(str(direct)) == str(direct)
    nested = tmp_path / "nested"  # upstream's layout: checkpoint-<step> inside Tune's folder
    for step in (4, 12, 8):
        (nested / f"checkpoint-{step}").mkdir(parents=True)
    assert hpo_ray.checkpoint_folder(str(nested)) == str(nested / "checkpoint-12")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no Trainer checkpoint"):
        hpo_ray.checkpoint_folder(str(empty))


def test_four_trials_two_at_a_time_return_the_best_by_direction(local_ray, make_trainer, tmp_path):
    trainer, journal = make_trainer(journal_type=Rendezvous)
    original = trainer.args
    best = trainer.hyperparameter_search(
        backend="ray",
        hp_space=lambda _: {"learning_rate": tune.grid_search([1e-3, 0.3, 0.03, 0.01])},
        compute_objective=lambda metrics: -metrics["eval_loss"],
        n_trials=1,  # num_samples per grid point
        direction="maximize",
        reuse_actors=True,
        verbose=0,
    )
    assert isinstance(best, BestRun)
    trials = best.run_summary.trials
    assert len(trials) == 4 and all(t.status == "TERMINATED" for t in trials)
    objectives = {t.trial_id: t.last_result["objective"] for t in trials}
    assert best.run_id == max(objectives, key=objectives.get)
    assert best.objective == max(objectives.values())
    assert best.hyperparameters == {"learning_rate": 0.3}
    assert len(set(objectives.values())) == 4

    rows = read_journal(journal)
    assert most_at_once(rows) == 2  # two trials trained at the same time (they met), never more
    assert {r["pid"] for r in rows if r["event"] == "begin"} and all(
        r["cpus"] == 1 for r in rows if r["event"] == "begin"
    )  # the default resources_per_trial: one CPU each
    for trial in trials:
        [begin] = [r for r in rows if r["event"] == "begin" and r["trial"] == trial.trial_id]
        # the trial's config reached the arguments, the state records the trial
        assert begin["learning_rate"] == trial.config["learning_rate"]
        assert begin["trial_name"] == f"run-{trial.trial_id}"
        assert begin["trial_params"] == trial.config
        evals = [r for r in rows if r["event"] == "eval" and r["trial"] == trial.trial_id]
        assert [e["step"] for e in evals] == [4, 8]
        # every evaluation reported: objective = compute_objective(metrics), with the checkpoint saved then
        assert trial.last_result["training_iteration"] == 2
        assert trial.last_result["objective"] == pytest.approx(-evals[-1]["eval_loss"])
        assert trial.last_result["eval_loss"] == pytest.approx(evals[-1]["eval_loss"])
        run = tmp_path / "out" / f"run-{trial.trial_id}"
        assert sorted(os.listdir(run)) == ["checkpoint-4", "checkpoint-8"]
        reported = trial.checkpoint.path  # Tune's copy of the trainer's last checkpoint
        assert os.path.isfile(os.path.join(reported, "trainer_state.json"))
        with open(os.path.join(reported, "trainer_state.json")) as f:
            assert json.load(f)["global_step"] == 8
    assert trainer.args is original and trainer.hp_search_backend is None
    assert trainer.model is not None  # the caller's trainer was not emptied for shipping


def test_a_failed_trial_is_an_error_naming_its_cause(local_ray, make_trainer):
    trainer, _ = make_trainer()
    with pytest.raises(
        RuntimeError, match=r"1 of 1 Ray Tune trials failed: \w+: .*per_device_train_batch_size.*traceback: "
    ):
        trainer.hyperparameter_search(
            backend="ray", hp_space=lambda _: {"per_device_train_batch_size": 0}, n_trials=1, verbose=0
        )


class HoldsALock(TrainerCallback):
    def __init__(self):
        import threading

        self.lock = threading.Lock()


def test_a_trainer_that_does_not_pickle_is_refused_naming_what_must(local_ray, make_trainer):
    trainer, journal = make_trainer()
    trainer.add_callback(HoldsALock())
    with pytest.raises(
        RuntimeError, match=r"(?s)could not send the Trainer to Ray.s workers.*must pickle.*_thread.lock"
    ):
        trainer.hyperparameter_search(backend="ray", hp_space=lr_space, n_trials=1, verbose=0)
    assert not os.path.exists(journal)  # no trial started


def test_asha_stops_a_bad_trial_at_its_first_rung(local_ray, make_trainer):
    trainer, journal = make_trainer(max_steps=16, save_strategy="no")
    # the initial model (a=b=0) has an eval loss near 14; a tiny rate keeps it there
    scheduler = tune.schedulers.ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
    with pytest.warns(UserWarning, match=r"not TrainingArguments fields.*\['hidden_size'\]"):
        best = trainer.hyperparameter_search(
            backend="ray",
            hp_space=lambda _: {"learning_rate": tune.grid_search([0.5, 1e-9]), "hidden_size": 4},
            n_trials=1,
            scheduler=scheduler,
            max_concurrent_trials=1,  # the good trial first, so the bad one meets its result at the rung
            reuse_actors=True,
            verbose=0,
        )
    by_lr = {t.config["learning_rate"]: t for t in best.run_summary.trials}
    assert by_lr[0.5].last_result["training_iteration"] == 4  # ran to the end (16 steps)
    assert by_lr[1e-9].last_result["training_iteration"] == 1  # stopped at the first rung
    assert by_lr[1e-9].last_result["objective"] > by_lr[0.5].last_result["objective"]
    rows = read_journal(journal)
    bad_evals = [r["step"] for r in rows if r["event"] == "eval" and r["trial"] == by_lr[1e-9].trial_id]
    assert bad_evals[0] == 4 and len(bad_evals) < 4
    assert best.hyperparameters == {"learning_rate": 0.5, "hidden_size": 4}  # the trial's whole config


@pytest.mark.slow  # 11-24 s here: run with -m slow
def test_pbt_clones_a_reported_checkpoint_and_the_trial_resumes_from_it(local_ray, make_trainer):
    trainer, journal = make_trainer(max_steps=16)
    scheduler = tune.schedulers.PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        quantile_fraction=0.5,
        hyperparam_mutations={"learning_rate": [0.5]},
        synch=True,
    )
    best = trainer.hyperparameter_search(
        backend="ray",
        hp_space=lambda _: {"learning_rate": tune.grid_search([0.5, 1e-9])},
        n_trials=1,
        scheduler=scheduler,
        reuse_actors=True,
        verbose=0,
    )
    rows = read_journal(journal)
    [bad] = {r["trial"] for r in rows if r["event"] == "begin" and r["learning_rate"] == 1e-9}
    begins = [r for r in rows if r["event"] == "begin" and r["trial"] == bad]
    # after 2 reports (step 8) the bad trial exploited the good one: it restarted from the good
    # trial's checkpoint of step 8, with the good trial's learning rate, and trained to the end
    assert [(r["global_step"], r["learning_rate"]) for r in begins[:2]] == [(0, 1e-9), (8, 0.5)]
    # (at the last perturbation, step 16, PBT may clone again: the run is then already complete)
    assert all((r["global_step"], r["learning_rate"]) == (16, 0.5) for r in begins[2:])
    evals = [r["step"] for r in rows if r["event"] == "eval" and r["trial"] == bad]
    assert evals[:4] == [4, 8, 12, 16] and set(evals[4:]) <= {16}
    ends = [r["step"] for r in rows if r["event"] == "end" and r["trial"] == bad]
    assert ends[0] == 16 and set(ends) == {16}
    trial = next(t for t in best.run_summary.trials if t.trial_id == bad)
    assert trial.config["learning_rate"] == 0.5
    assert trial.last_result["objective"] < 5.0  # the cloned model, not the untrained one (~14)


def test_ray_scope_picks_the_best_trial_by_that_scope(local_ray, make_trainer, monkeypatch):
    with pytest.raises(ValueError, match="ray_scope"):
        make_trainer(ray_scope="best-ever")  # not one of Ray Tune's scopes: refused, naming the field
    monkeypatch.delenv("RAY_SCOPE", raising=False)
    scopes = []
    real = tune.ExperimentAnalysis.get_best_trial

    def spy(self, *args, **kwargs):
        scopes.append(kwargs.get("scope"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tune.ExperimentAnalysis, "get_best_trial", spy)
    trainer, _ = make_trainer(ray_scope="avg")
    best = trainer.hyperparameter_search(
        backend="ray",
        hp_space=lambda _: {"learning_rate": tune.grid_search([0.3, 0.01])},
        compute_objective=lambda metrics: -metrics["eval_loss"],
        n_trials=1,
        direction="maximize",
        verbose=0,
    )
    assert scopes == ["avg"]
    expected = real(best.run_summary, metric="objective", mode="max", scope="avg")
    assert best.run_id == expected.trial_id

"""trainwright.integrations / trainwright.trainer_utils / top-level names: what scripts import from
transformers, checked against the installed transformers, plus ExportableState round trips."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest
import torch
from conftest import RegressionDataset, RegressionModel
from kit.reporters import TinyModel, make_args, make_state

import trainwright
from trainwright import integrations, trainer_utils
from trainwright.callbacks import EarlyStoppingCallback
from trainwright.core.state import ExportableState, TrainerControl
from trainwright.reporters import Reporter

transformers = pytest.importorskip("transformers")

# Trainer-family names the official example scripts (examples/pytorch: run_clm, run_mlm, run_glue,
# run_ner, run_qa, run_summarization, run_translation, run_image_classification, ...) import from
# `transformers` and `transformers.trainer_utils`; model, tokenizer, config and data-collator
# classes (DataCollatorWithPadding, DataCollatorForSeq2Seq, ...) stay transformers'.
TOP_LEVEL = [
    "Trainer", "TrainingArguments", "Seq2SeqTrainer", "Seq2SeqTrainingArguments", "HfArgumentParser",
    "EvalPrediction", "IntervalStrategy", "SchedulerType", "set_seed", "enable_full_determinism",
    "default_data_collator", "TrainerCallback", "TrainerState", "TrainerControl", "DefaultFlowCallback",
    "PrinterCallback", "ProgressCallback", "EarlyStoppingCallback", "get_scheduler",
    "get_constant_schedule", "get_constant_schedule_with_warmup", "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup", "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate", "get_inverse_sqrt_schedule",
    "get_linear_schedule_with_warmup", "get_polynomial_decay_schedule_with_warmup",
    "get_reduce_on_plateau_schedule", "get_wsd_schedule", "torch_distributed_zero_first",
    "is_clearml_available", "is_comet_available", "is_dvclive_available", "is_neptune_available",
    "is_optuna_available", "is_swanlab_available", "is_tensorboard_available", "is_wandb_available",
]  # fmt: skip
TRAINER_UTILS = [
    "get_last_checkpoint", "is_main_process", "total_processes_number", "set_seed", "enable_full_determinism",
    "seed_worker", "EvalPrediction", "EvalLoopOutput", "PredictionOutput", "TrainOutput", "BestRun",
    "IntervalStrategy", "SaveStrategy", "HubStrategy", "SchedulerType", "FSDPOption", "PREFIX_CHECKPOINT_DIR",
    "default_compute_objective", "default_hp_space_optuna", "speed_metrics", "denumpify_detensorize",
    "has_length",
]  # fmt: skip
CALLBACKS = {
    "WandbCallback": "wandb", "MLflowCallback": "mlflow", "TensorBoardCallback": "tensorboard",
    "CometCallback": "comet_ml", "NeptuneCallback": "neptune", "ClearMLCallback": "clearml",
    "DVCLiveCallback": "dvclive", "CodeCarbonCallback": "codecarbon", "AzureMLCallback": "azure_ml",
    "FlyteCallback": "flyte", "DagsHubCallback": "dagshub", "SwanLabCallback": "swanlab",
    "KubeflowCallback": "kubeflow",
}  # fmt: skip
# transformers' public methods (besides events) that scripts and subclasses call or override.
PUBLIC_METHODS = {
    "WandbCallback": ["setup"], "CometCallback": ["setup"], "MLflowCallback": ["setup"],
    "DagsHubCallback": ["setup"], "ClearMLCallback": ["setup"], "DVCLiveCallback": ["setup"],
    "SwanLabCallback": ["setup"], "NeptuneCallback": ["get_run"],
}  # fmt: skip


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_name_is_ours_and_transformers_has_it(name):
    ours = getattr(trainwright, name)
    assert ours.__module__.startswith("trainwright"), ours
    assert name in trainwright.__all__
    assert hasattr(transformers, name)  # the name a script changes the import of


@pytest.mark.parametrize("name", TRAINER_UTILS)
def test_trainer_utils_name_is_ours_and_matches_transformers(name):
    exec(f"from trainwright.trainer_utils import {name}", {})
    ours = getattr(trainer_utils, name)
    upstream = getattr(importlib.import_module("transformers.trainer_utils"), name)
    if name == "PREFIX_CHECKPOINT_DIR":
        assert ours == upstream
        return
    assert ours.__module__.startswith("trainwright"), ours
    if inspect.isfunction(upstream):
        # every positional parameter upstream's callers can pass, by the same name and order
        up = [p.name for p in inspect.signature(upstream).parameters.values()]
        mine = [p.name for p in inspect.signature(ours).parameters.values()]
        assert mine[: len(up)] == up


def test_trainer_utils_process_helpers():
    assert trainer_utils.is_main_process(-1) and trainer_utils.is_main_process(0)
    assert not trainer_utils.is_main_process(1)
    assert trainer_utils.total_processes_number(-1) == 1
    ran = []
    with trainer_utils.torch_distributed_zero_first(-1):  # not distributed: no barrier
        ran.append(1)
    assert ran == [1]


def _init_params(cls: type) -> dict[str, inspect._ParameterKind]:
    """Constructor parameters by name and kind; the name of **kwargs is no caller's business."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {("**" if p.kind is p.VAR_KEYWORD else p.name): p.kind for p in params if p.name != "self"}


@pytest.mark.parametrize("name", sorted(CALLBACKS))
def test_integration_callbacks_are_the_report_to_reporters(name):
    exec(f"from trainwright.integrations import {name}", {})
    cls = getattr(integrations, name)
    assert issubclass(cls, Reporter) and cls.name == CALLBACKS[name]
    assert integrations.INTEGRATION_TO_CALLBACK[CALLBACKS[name]] is cls  # the class report_to creates
    upstream = getattr(importlib.import_module("transformers.integrations.integration_utils"), name)
    # the constructor takes what transformers' takes, by name (and kind: keyword-only stays so)
    assert _init_params(cls) == _init_params(upstream)
    for method in PUBLIC_METHODS.get(name, []):
        up_params = list(inspect.signature(getattr(upstream, method)).parameters)
        mine_params = list(inspect.signature(getattr(cls, method)).parameters)
        required = [p for p in up_params if p not in ("self", "cls", "args", "kwargs")]
        assert all(p in mine_params or "kwargs" in mine_params for p in required), (method, up_params)


def test_registry_and_availability_helpers():
    mapping = integrations.INTEGRATION_TO_CALLBACK
    upstream = importlib.import_module("transformers.integrations.integration_utils").INTEGRATION_TO_CALLBACK
    assert set(upstream) - {"trackio"} <= set(mapping)  # trackio: not implemented (see compatibility)
    assert set(mapping) - set(upstream) == {"jsonl", "csv"}
    assert integrations.get_reporting_integration_callbacks(["tensorboard"]) == [mapping["tensorboard"]]
    with pytest.raises(KeyError):
        mapping["tensorbored"]
    for helper in [n for n in integrations.__all__ if n.startswith("is_") and n != "is_kubeflow_available"]:
        upstream_helper = getattr(
            importlib.import_module("transformers.integrations.integration_utils"), helper
        )
        if helper == "is_comet_available":  # transformers also requires a configured API key
            continue
        assert getattr(integrations, helper)() == bool(upstream_helper()), helper


def test_is_kubeflow_available_follows_the_controller_variables(monkeypatch):
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    monkeypatch.delenv("DISABLE_KUBEFLOW_INTEGRATION", raising=False)
    assert not integrations.is_kubeflow_available()
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://trainer.kubeflow:8443/status")
    assert integrations.is_kubeflow_available()
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "TRUE")
    assert not integrations.is_kubeflow_available()


def test_mlflow_setup_starts_the_run_before_training(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    import mlflow

    callback = integrations.MLflowCallback()
    args = make_args(tmp_path)
    callback.setup(args, make_state(), TinyModel())
    try:
        run = mlflow.MlflowClient(mlflow.get_tracking_uri()).get_run(callback.run_id)
        assert run.data.params["run_name"] == "run-1" and run.data.params["hidden_size"] == "4"
    finally:
        mlflow.end_run()


def test_neptune_get_run_returns_the_trainer_s_run_offline(tmp_path, monkeypatch):
    pytest.importorskip("neptune")
    monkeypatch.setenv("NEPTUNE_MODE", "offline")
    monkeypatch.delenv("NEPTUNE_API_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)  # neptune keeps offline runs in ./.neptune
    callback = integrations.NeptuneCallback(
        project="workspace/project",
        capture_stdout=False,
        capture_stderr=False,
        capture_hardware_metrics=False,
    )
    trainer = trainwright.Trainer(
        model=RegressionModel(),
        args=make_args(tmp_path / "out", max_steps=2, disable_tqdm=True, save_strategy="no"),
        train_dataset=RegressionDataset(length=8),
        callbacks=[callback],
    )
    run = integrations.NeptuneCallback.get_run(trainer)
    assert run is callback.run
    run["custom/value"] = 3
    trainer.train()  # the same run gets the metrics, and is stopped at the end
    assert callback.run is None
    ops = [
        json.loads(line)["obj"]
        for log in sorted((tmp_path / ".neptune").rglob("data-*.log"))
        for line in log.read_text().splitlines()
        if line.strip()
    ]
    assert any(op.get("path") == ["custom", "value"] for op in ops)
    assert any(op.get("path") == ["finetuning", "train", "loss"] for op in ops)
    with pytest.raises(ValueError, match="doesn't have a NeptuneCallback"):
        integrations.NeptuneCallback.get_run(
            trainwright.Trainer(model=RegressionModel(), args=make_args(tmp_path / "o2", report_to="none"))
        )


def test_tensorboard_callback_takes_a_writer(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    callback = integrations.TensorBoardCallback(tb_writer=writer)
    assert callback.tb_writer is writer
    writer.close()


def test_trainer_control_round_trips_through_from_state():
    control = TrainerControl(should_training_stop=True, should_save=True)
    saved = json.loads(json.dumps(control.state()))  # as trainer_state.json holds it
    restored = TrainerControl.from_state(saved)
    assert restored == control and restored is not control
    assert isinstance(control, ExportableState)


def test_early_stopping_round_trips_through_from_state():
    callback = EarlyStoppingCallback(early_stopping_patience=3, early_stopping_threshold=0.01)
    callback.early_stopping_patience_counter = 2
    callback.best_metric = 0.25
    saved = json.loads(json.dumps(callback.state()))
    restored = EarlyStoppingCallback.from_state(saved)
    assert (restored.early_stopping_patience, restored.early_stopping_threshold) == (3, 0.01)
    assert (restored.early_stopping_patience_counter, restored.best_metric) == (2, 0.25)
    assert isinstance(callback, ExportableState)


def test_exportable_state_base_class_as_upstream():
    class Counter(trainwright.TrainerCallback, ExportableState):
        def __init__(self, start: int = 0) -> None:
            self.start = start
            self.seen = 0

        def state(self) -> dict:
            return {"args": {"start": self.start}, "attributes": {"seen": self.seen}}

    counter = Counter(start=5)
    counter.seen = 7
    restored = Counter.from_state(counter.state())
    assert (restored.start, restored.seen) == (5, 7)

    class NoState(ExportableState):
        pass

    with pytest.raises(NotImplementedError, match="NoState must implement state"):
        NoState().state()
    assert not isinstance(torch.nn.Linear(1, 1), ExportableState)

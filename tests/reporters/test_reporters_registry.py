"""The report_to registry, rewrite_logs and the Reporter base class (rank gating, self-disabling)."""

from __future__ import annotations

import logging

import pytest
from kit.reporters import drive, logged, make_args, make_state

from trainwright.reporters import (
    INTEGRATION_TO_CALLBACK,
    MissingReporterPackageError,
    Reporter,
    get_available_reporting_integrations,
    get_reporter_class,
    get_reporting_integration_callbacks,
    normalize_report_to,
    rewrite_logs,
)
from trainwright.reporters.base import as_scalar, env_choice, env_flag
from trainwright.reporters.files import JsonlCallback
from trainwright.reporters.mlflow import MLflowCallback

CREDENTIAL_VARS = (
    "WANDB_API_KEY",
    "WANDB_MODE",
    "WANDB_DISABLED",
    "NETRC",
    "COMET_API_KEY",
    "COMET_MODE",
    "COMET_START_ONLINE",
    "COMET_CONFIG",
    "NEPTUNE_API_TOKEN",
    "NEPTUNE_MODE",
    "CLEARML_OFFLINE_MODE",
    "CLEARML_CONFIG_FILE",
    "CLEARML_API_ACCESS_KEY",
    "CLEARML_API_SECRET_KEY",
    "MLFLOW_TRACKING_URI",
    "AZUREML_RUN_ID",
    "FLYTE_INTERNAL_EXECUTION_ID",
)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, ~/.comet.config, ~/clearml.conf
    return monkeypatch


def test_rewrite_logs_groups_keys():
    logs = {"loss": 1.0, "eval_loss": 2.0, "test_acc": 0.5, "throughput/samples_per_sec": 9.0, "epoch": 1}
    assert rewrite_logs(logs) == {
        "train/loss": 1.0,
        "eval/loss": 2.0,
        "test/acc": 0.5,
        "throughput/samples_per_sec": 9.0,
        "train/epoch": 1,
    }


def test_as_scalar_accepts_numbers_and_one_element_tensors():
    import numpy as np
    import torch

    assert as_scalar(3) == 3 and as_scalar(True) == 1 and as_scalar(np.float32(0.5)) == 0.5
    assert as_scalar(torch.tensor(2.5)) == 2.5 and as_scalar(np.array(4)) == 4
    assert as_scalar("1.0") is None and as_scalar(torch.ones(2)) is None and as_scalar(1j) is None


def test_registry_names_and_targets_resolve():
    expected = {
        "tensorboard", "mlflow", "wandb", "comet_ml", "neptune", "clearml", "dvclive",
        "codecarbon", "azure_ml", "dagshub", "flyte", "swanlab", "kubeflow", "jsonl", "csv",
    }  # fmt: skip
    assert set(INTEGRATION_TO_CALLBACK) == expected
    for name in expected:
        cls = get_reporter_class(name)
        assert issubclass(cls, Reporter) and cls.name == name


@pytest.mark.parametrize("value", ["none", ["none"], [], None])
def test_none_means_no_reporter(value):
    assert get_reporting_integration_callbacks(value) == []


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown integration 'tensorbored'.*jsonl.*tensorboard"):
        get_reporting_integration_callbacks(["jsonl", "tensorbored"])


def test_named_reporters_in_order_without_duplicates():
    classes = get_reporting_integration_callbacks(["jsonl", "tensorboard", "jsonl"])
    assert [c.name for c in classes] == ["jsonl", "tensorboard"]
    assert [c.name for c in get_reporting_integration_callbacks("csv")] == ["csv"]


def test_missing_package_names_what_to_install(monkeypatch):
    # azure_ml and flyte are not installed in this environment (they conflict with other packages).
    for name, pip_name in (("azure_ml", "azureml-core"), ("flyte", "flytekit")):
        assert name not in get_available_reporting_integrations()
        with pytest.raises(MissingReporterPackageError, match=f"report_to='{name}'.*pip install {pip_name}"):
            get_reporting_integration_callbacks(name)
    monkeypatch.setattr(MLflowCallback, "requires", ("no_such_mlflow_pkg",))
    with pytest.raises(ImportError) as info:
        get_reporting_integration_callbacks("mlflow")
    assert "pip install 'trainwright[mlflow]' or pip install mlflow-skinny" in str(info.value)
    with pytest.raises(MissingReporterPackageError):
        MLflowCallback()  # building one directly says the same


def test_all_skips_reporters_without_credentials_with_one_info_line_each(clean_env, caplog):
    caplog.set_level(logging.INFO, logger="trainwright.reporters")
    names = normalize_report_to("all")
    installed = get_available_reporting_integrations()
    for name in ("tensorboard", "mlflow", "dvclive", "codecarbon", "jsonl"):
        assert (name in names) == (name in installed)
    for name in ("wandb", "comet_ml", "neptune", "clearml", "dagshub", "csv", "azure_ml", "flyte"):
        assert name not in names
    skipped = logged(caplog, "leaves out")
    for name in ("wandb", "comet_ml", "neptune", "clearml", "dagshub"):
        if name in installed:
            assert len([m for m in skipped if f"leaves out {name}:" in m]) == 1
    assert any("WANDB_API_KEY" in m for m in skipped)


def test_all_includes_offline_configured_services(clean_env):
    clean_env.setenv("WANDB_MODE", "offline")
    clean_env.setenv("COMET_MODE", "offline")
    clean_env.setenv("NEPTUNE_MODE", "offline")
    clean_env.setenv("CLEARML_OFFLINE_MODE", "1")
    installed = get_available_reporting_integrations()
    names = normalize_report_to(["all", "csv"])
    for name in ("wandb", "comet_ml", "neptune", "clearml"):
        assert (name in names) == (name in installed)
    assert names[-1] == "csv" and names.count("jsonl") == 1


def test_wandb_key_in_netrc_counts_as_credentials(clean_env, tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    netrc.chmod(0o600)
    clean_env.setenv("NETRC", str(netrc))
    assert ("wandb" in normalize_report_to("all")) == ("wandb" in get_available_reporting_integrations())


def test_env_parsing_errors_name_the_variable(monkeypatch):
    monkeypatch.setenv("SOME_FLAG", "maybe")
    with pytest.raises(ValueError, match="SOME_FLAG='maybe'"):
        env_flag("SOME_FLAG")
    monkeypatch.setenv("SOME_CHOICE", "sometimes")
    with pytest.raises(ValueError, match="SOME_CHOICE='sometimes': expected one of a, b"):
        env_choice("SOME_CHOICE", ("a", "b"), "a")
    monkeypatch.setenv("MLFLOW_TAGS", "{not json")
    with pytest.raises(ValueError, match="MLFLOW_TAGS: not valid JSON"):
        MLflowCallback()


# -- the base class: failures disable the reporter, training goes on -----------------------------
class Flaky(Reporter):
    name = "flaky"

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.logged: list[int] = []
        self.closed = 0
        self.ended = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == self.fail_at:
            raise OSError(28, "No space left on device")
        self.logged.append(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.ended = True

    def close_after_failure(self) -> None:
        self.closed += 1


class FlakyChild(Flaky):
    def on_log(self, args, state, control, logs=None, **kwargs):
        super().on_log(args, state, control, logs=logs, **kwargs)
        self.logged.append(-state.global_step)  # never reached once the parent raised


def test_failing_reporter_warns_once_disables_itself_and_training_continues(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    flaky = Flaky(fail_at=2)
    other = JsonlCallback()
    args = make_args(tmp_path)
    drive([flaky, other], args, [(1, {"loss": 1.0}), (2, {"loss": 0.9}), (3, {"loss": 0.8})])
    assert flaky.logged == [1] and flaky.disabled and flaky.closed == 1
    assert not flaky.ended  # disabled: later events are not run
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "flaky" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert (
        "on_log" in warnings[0]
        and "No space left on device" in warnings[0]
        and "training continues" in warnings[0]
    )
    assert len((tmp_path / "logs.jsonl").read_text().splitlines()) == 3  # the other reporter went on


def test_failure_inside_super_call_is_reported_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    child = FlakyChild(fail_at=1)
    drive(child, make_args(tmp_path), [(1, {"loss": 1.0}), (2, {"loss": 0.5})])
    assert child.logged == [] and child.disabled
    assert len(logged(caplog, "flaky")) == 1


def test_only_the_main_process_reports(tmp_path):
    flaky = Flaky(fail_at=-1)
    drive(flaky, make_args(tmp_path), [(1, {"loss": 1.0})], state=make_state(is_world_process_zero=False))
    assert flaky.logged == [] and not flaky.ended

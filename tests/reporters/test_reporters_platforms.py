"""Reporters tied to a platform: DagsHub (MLflow on DagsHub), Azure ML and Flyte.

azureml-core and flytekit are not in the project environment (they would downgrade packages
others need): their full tests below run only where they are installed (they were run with both
installed in a separate --target folder); here the install hints, "all" leaving them out and the
Flyte log-history table are checked. DagsHub is installed; with no network its tracking server
is unreachable, which is exactly the "service down" case."""

from __future__ import annotations

import logging
from html.parser import HTMLParser
from pathlib import Path

import pytest
from kit.reporters import TinyModel, drive, logged, make_args

from trainwright.reporters import MissingReporterPackageError, get_reporter_class
from trainwright.reporters.dagshub import DagsHubCallback, parse_dagshub_uri
from trainwright.reporters.flyte import log_history_html


def test_azure_and_flyte_need_their_packages_and_a_platform(monkeypatch):
    for name, pip_name, env in (
        ("azure_ml", "azureml-core", "AZUREML_RUN_ID"),
        ("flyte", "flytekit", "FLYTE_INTERNAL_EXECUTION_ID"),
    ):
        cls = get_reporter_class(name)
        if not cls.missing_packages():
            pytest.skip(f"{pip_name} is installed here")
        with pytest.raises(MissingReporterPackageError, match=f"pip install {pip_name}"):
            cls()
        monkeypatch.delenv(env, raising=False)
        assert env in cls.skip_reason()
        monkeypatch.setenv(env, "abc")
        assert cls.skip_reason() is None


class _Table(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])

    def handle_data(self, data):
        if self.rows:
            self.rows[-1].append(data)


def test_flyte_log_history_table():
    history = [{"loss": 1.5, "step": 2}, {"eval_loss": 1.25, "step": 2}, {"note": "<b>&", "step": 4}]
    parser = _Table()
    parser.feed(log_history_html(history))
    header, *rows = parser.rows
    assert header == ["loss", "step", "eval_loss", "note"]
    assert rows == [["1.5", "2"], ["2", "1.25"], ["4", "<b>&"]]  # empty cells carry no data
    assert "<b>" not in log_history_html(history).replace("<tbody>", "")


def test_dagshub_needs_a_dagshub_tracking_uri(monkeypatch):
    pytest.importorskip("dagshub")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ValueError, match="needs the environment variable MLFLOW_TRACKING_URI"):
        DagsHubCallback()
    assert "DagsHub" in DagsHubCallback.skip_reason()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://localhost:5000")
    with pytest.raises(ValueError, match="expects https://dagshub.com/<owner>/<repo>.mlflow"):
        DagsHubCallback()
    assert parse_dagshub_uri("https://dagshub.com/alice/tiny-repo.mlflow") == ("alice", "tiny-repo")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://dagshub.com/alice/tiny-repo.mlflow")
    assert DagsHubCallback.skip_reason() is None


def test_dagshub_unreachable_disables_itself_and_training_continues(monkeypatch, tmp_path, caplog):
    pytest.importorskip("dagshub")
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking._tracking_service import utils as tracking_utils

    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://dagshub.invalid/alice/tiny-repo.mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-a-token")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.setenv("HF_DAGSHUB_LOG_ARTIFACTS", "true")
    caplog.set_level(logging.WARNING)
    reporter = DagsHubCallback()
    assert (reporter.repo_owner, reporter.repo_name, reporter.upload_artifacts) == (
        "alice",
        "tiny-repo",
        True,
    )
    state = drive(reporter, make_args(tmp_path), [(1, {"loss": 1.0}), (2, {"loss": 0.5})], model=TinyModel())
    assert reporter.disabled and state.global_step == 2 and mlflow.active_run() is None
    messages = logged(caplog, "dagshub reporter is disabled")
    assert len(messages) == 1 and "on_train_begin" in messages[0]


def test_flyte_task_syncs_checkpoints_and_adds_the_log_history_deck(tmp_path):
    flytekit = pytest.importorskip("flytekit")
    from trainwright.reporters.flyte import FlyteCallback

    @flytekit.task(enable_deck=True)
    def train(out: str) -> list[str]:
        reporter = FlyteCallback()
        drive(reporter, make_args(out), [(2, {"loss": 1.5}), (4, {"eval_loss": 1.0})], save_steps=[2, 4])
        assert not reporter.disabled
        context = flytekit.current_context()
        synced = sorted(p.name for p in Path(context.checkpoint._checkpoint_dest).iterdir())
        (deck,) = [d for d in context.decks if d.name == "Log History"]
        assert "<td>1.5</td>" in deck.html and "<th>eval_loss</th>" in deck.html
        return synced

    assert train(out=str(tmp_path / "out")) == ["model.safetensors", "trainer_state.json"]


def test_azure_ml_logs_numbers_to_the_run_context(tmp_path, capsys):
    pytest.importorskip("azureml.core")
    from trainwright.reporters.azureml import AzureMLCallback

    reporter = AzureMLCallback()
    drive(reporter, make_args(tmp_path), [(2, {"loss": 1.5, "note": "x"}), (4, {"eval_loss": 1.0})])
    # outside an Azure ML job the context is an offline run, which prints what it is asked to log
    assert type(reporter.azureml_run).__name__ == "_OfflineRun" and not reporter.disabled
    out = capsys.readouterr().out
    assert "scalar metric loss:\n1.5" in out and "scalar metric eval_loss:\n1.0" in out and "note" not in out

"""Comet reporter in offline mode; the offline archive's messages are read back."""

from __future__ import annotations

import importlib.util
import logging

import pytest
from kit.reporters import TinyModel, comet_offline, drive, end_and_read, logged, make_args

from trainwright.reporters.comet import CometCallback

if importlib.util.find_spec("comet_ml") is None:
    pytest.skip("comet_ml is not installed", allow_module_level=True)
comet_ml = None  # imported by the fixture, after COMET_DISABLE_AUTO_LOGGING is set

LOGS = [
    (2, {"loss": 1.5, "learning_rate": 0.1}),
    (4, {"eval_loss": 1.25, "eval_note": "text"}),
]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    comet_offline(monkeypatch, tmp_path)
    global comet_ml
    import comet_ml

    yield monkeypatch
    running = comet_ml.get_running_experiment()
    if running is not None and not running.ended:
        running.end()


def test_offline_experiment_params_metrics_and_name(offline, tmp_path):
    offline.setenv("COMET_LOG_ASSETS", "false")
    offline.setenv("COMET_PROJECT_NAME", "tiny-project")
    args = make_args(tmp_path / "out", run_name="comet-run", learning_rate=3e-4)
    drive(CometCallback(), args, LOGS, model=TinyModel())
    messages, experiment = end_and_read(tmp_path, with_experiment=True)
    assert experiment["project_name"] == "tiny-project"
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}
    assert others["Name"] == "comet-run"
    params = {}
    for m in messages:
        if m["type"] == "parameter_msg":  # list values come as "params", others as "param"
            p = m["payload"].get("param") or m["payload"]["params"]
            params[p["paramName"]] = p["paramValue"]
    assert params["args_learning_rate"] == 3e-4 and params["config_hidden_size"] == 4
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    assert sorted((m["metricName"], m["metricValue"], m["step"], m["epoch"]) for m in metrics) == [
        ("eval/loss", 1.25, 4, 0.4),
        ("train/learning_rate", 0.1, 2, 0.2),
        ("train/loss", 1.5, 2, 0.2),
    ]
    assert not any(m["type"] == "file_upload" for m in messages)


def test_output_folder_logged_as_assets(offline, tmp_path):
    drive(CometCallback(), make_args(tmp_path / "out"), LOGS[:1], save_steps=[2])
    uploads = [m["payload"] for m in end_and_read(tmp_path) if m["type"] == "file_upload"]
    names = sorted(u["additional_params"]["fileName"].rsplit("/", 1)[-1] for u in uploads)
    assert names == ["model.safetensors", "trainer_state.json"]
    assert {u["additional_params"]["step"] for u in uploads} == {2}


def test_disabled_mode_and_bad_mode(offline, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainwright")
    offline.setenv("COMET_MODE", "disabled")
    reporter = CometCallback()
    drive(reporter, make_args(tmp_path), LOGS[:1])
    running = comet_ml.get_running_experiment()  # an ended one from an earlier test may linger
    assert reporter.disabled and (running is None or running.ended)
    assert not (tmp_path / "comet").exists()
    assert len(logged(caplog, "COMET_MODE is disabled")) == 1
    offline.setenv("COMET_MODE", "sideways")
    with pytest.raises(ValueError, match="COMET_MODE='sideways'"):
        CometCallback()

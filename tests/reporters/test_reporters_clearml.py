"""ClearML reporter in offline mode; the offline session folder (task.json, metrics.jsonl) is read back."""

from __future__ import annotations

import glob
import json
import logging
import os

import pytest
from kit.reporters import TinyModel, drive, logged, make_args

pytest.importorskip("clearml")

from trainwright.reporters.clearml import ClearMLCallback  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # clearml's vendored pyparsing use

LOGS = [
    (2, {"loss": 1.5, "learning_rate": 0.1}),
    (4, {"eval_loss": 1.25, "throughput/samples_per_sec": 64.0}),
    (4, {"train_runtime": 3.5, "train_loss": 1.2, "epoch": 0.4}),
]

# Report from a thread instead of a subprocess (the subprocess flushes on a 5 s timer) and skip
# the pip freeze: the same data, written in well under a second.
CLEARML_CONF = """
sdk {
  development {
    report_use_subprocess: false
    detect_with_pip_freeze: false
  }
}
"""


@pytest.fixture
def offline(monkeypatch, tmp_path):
    for name in ("CLEARML_PROJECT", "CLEARML_TASK", "CLEARML_LOG_MODEL", "CLEARML_API_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    conf = tmp_path / "clearml.conf"
    conf.write_text(CLEARML_CONF)
    monkeypatch.setenv("CLEARML_CONFIG_FILE", str(conf))
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def session(tmp_path) -> tuple[dict, list[dict]]:
    (folder,) = [p for p in glob.glob(str(tmp_path / "cache" / "offline" / "*")) if os.path.isdir(p)]
    with open(os.path.join(folder, "task.json")) as f:
        task = json.load(f)
    events: list[dict] = []
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                events += json.loads(line)
    return task, events


def test_offline_task_hyperparameters_scalars_and_single_values(offline, tmp_path):
    offline.setenv("CLEARML_PROJECT", "tiny-project")
    reporter = ClearMLCallback()
    drive(reporter, make_args(tmp_path / "out", learning_rate=3e-4), LOGS, model=TinyModel())
    assert reporter.task is None  # closed at the end of training
    task, events = session(tmp_path)
    assert task["project_name"] == "tiny-project" and task["name"] == "Trainer"
    assert task["hyperparams"]["Args"]["learning_rate"]["value"] == "0.0003"
    scalars = sorted(
        (e["metric"], e["variant"], e["iter"], e["value"])
        for e in events
        if e["type"] == "training_stats_scalar"
    )
    assert ("train", "loss", 2, 1.5) in scalars and ("eval", "loss", 4, 1.25) in scalars
    assert ("throughput", "samples_per_sec", 4, 64.0) in scalars
    assert ("train", "epoch", 4, 0.4) in scalars
    # single values are stored by clearml as scalars of the "Summary" title
    assert not any(s[0] != "Summary" and s[1] in ("train_runtime", "train_loss") for s in scalars)
    singles = {(e["variant"], e["value"]) for e in events if e["metric"] == "Summary"}
    assert singles == {("train_runtime", 3.5), ("train_loss", 1.2)}


def test_checkpoint_model_failure_costs_only_checkpoint_logging(offline, tmp_path, caplog):
    # clearml cannot register output models offline; the reporter must keep logging metrics.
    caplog.set_level(logging.WARNING)
    offline.setenv("CLEARML_LOG_MODEL", "true")
    reporter = ClearMLCallback()
    drive(reporter, make_args(tmp_path / "out"), LOGS[:2], save_steps=[2, 4])
    assert not reporter.disabled and reporter.log_model is False
    warnings = logged(caplog, "output model")
    assert len(warnings) == 1 and "checkpoint-2" in warnings[0]
    _, events = session(tmp_path)
    assert ("eval", "loss", 4) in {(e["metric"], e["variant"], e["iter"]) for e in events}

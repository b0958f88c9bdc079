"""DVCLive reporter: metrics.json, per-metric .tsv plots and params.yaml read back from disk."""

from __future__ import annotations

import csv
import json

import pytest
import yaml
from kit.reporters import TinyModel, drive, make_args, make_state

pytest.importorskip("dvclive")

from trainwright.reporters.dvclive import DVCLiveCallback  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:dvc.*")

LOGS = [
    (2, {"loss": 1.5, "learning_rate": 0.1}),
    (4, {"loss": 1.0, "learning_rate": 0.05}),
    (4, {"eval_loss": 1.25, "eval_note": "text"}),
]


def plot(live_dir, *parts) -> list[tuple[int, float]]:
    path = live_dir.joinpath("plots", "metrics", *parts[:-1], parts[-1] + ".tsv")
    with open(path, newline="") as f:
        return [(int(r["step"]), float(r[parts[-1]])) for r in csv.DictReader(f, delimiter="\t")]


@pytest.fixture(autouse=True)
def outside_any_repo(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_DVCLIVE_LOG_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)  # dvclive looks for a git/DVC repository from the working directory


def test_metrics_plots_and_params(tmp_path):
    out = tmp_path / "out"
    drive(DVCLiveCallback(), make_args(out, learning_rate=3e-4), LOGS, model=TinyModel())
    live = out / "dvclive"
    assert plot(live, "train", "loss") == [(2, 1.5), (4, 1.0)]
    assert plot(live, "eval", "loss") == [(4, 1.25)]
    summary = json.loads((live / "metrics.json").read_text())
    assert summary["step"] == 4 and summary["train"]["loss"] == 1.0 and summary["eval"]["loss"] == 1.25
    assert "note" not in summary["eval"]
    params = yaml.safe_load((live / "params.yaml").read_text())
    assert params["learning_rate"] == 3e-4 and params["output_dir"] == str(out)


def test_resume_keeps_earlier_steps(tmp_path):
    out = tmp_path / "out"
    drive(DVCLiveCallback(), make_args(out), LOGS[:1])
    drive(DVCLiveCallback(), make_args(out), [(6, {"loss": 0.5})], state=make_state(global_step=4))
    assert plot(out / "dvclive", "train", "loss") == [(2, 1.5), (6, 0.5)]


def test_live_kwargs_and_given_live(tmp_path):
    from dvclive import Live

    drive(DVCLiveCallback(dir=str(tmp_path / "elsewhere")), make_args(tmp_path / "out"), LOGS[:1])
    assert plot(tmp_path / "elsewhere", "train", "loss") == [(2, 1.5)]
    live = Live(dir=str(tmp_path / "mine"), save_dvc_exp=False)
    drive(DVCLiveCallback(live=live), make_args(tmp_path / "out2"), LOGS[:1])
    live.log_metric("after", 1.0)  # left open for the caller
    live.end()
    assert plot(tmp_path / "mine", "train", "loss") == [(2, 1.5)]


def test_log_model_setting_is_validated(monkeypatch):
    monkeypatch.setenv("HF_DVCLIVE_LOG_MODEL", "all")
    assert DVCLiveCallback().log_model == "all"
    monkeypatch.setenv("HF_DVCLIVE_LOG_MODEL", "true")
    assert DVCLiveCallback().log_model is True
    monkeypatch.setenv("HF_DVCLIVE_LOG_MODEL", "best")
    with pytest.raises(ValueError, match="HF_DVCLIVE_LOG_MODEL='best'"):
        DVCLiveCallback()


def test_models_are_tracked_as_artifacts_in_a_dvc_repo(tmp_path):
    from dvc.repo import Repo

    Repo.init(str(tmp_path), no_scm=True)
    out = tmp_path / "out"
    drive(DVCLiveCallback(log_model="all"), make_args(out), LOGS[:2], save_steps=[2, 4], model=TinyModel())
    assert (out / "checkpoint-2.dvc").exists() and (out / "checkpoint-4.dvc").exists()
    drive(DVCLiveCallback(log_model=True), make_args(tmp_path / "final"), LOGS[:1], model=TinyModel())
    assert (tmp_path / "final" / "dvclive_model.dvc").exists()
    assert (tmp_path / "final" / "dvclive_model" / "model.safetensors").exists()

"""Neptune reporter in offline mode; the run's offline operation log (./.neptune) is read back."""

from __future__ import annotations

import glob
import json
import os

import pytest
from kit.reporters import TinyModel, drive, make_args, make_state

pytest.importorskip("neptune")

from trainwright.reporters.neptune import NeptuneCallback  # noqa: E402

LOGS = [
    (2, {"loss": 1.5, "learning_rate": 0.1}),
    (4, {"loss": 1.0, "learning_rate": 0.05}),
    (4, {"eval_loss": 1.25}),
]

QUIET = {
    "capture_stdout": False,
    "capture_stderr": False,
    "capture_hardware_metrics": False,
    "capture_traceback": False,
    "git_ref": False,
    "source_files": [],
}


@pytest.fixture
def offline(monkeypatch, tmp_path):
    for name in ("NEPTUNE_API_TOKEN", "NEPTUNE_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NEPTUNE_MODE", "offline")
    monkeypatch.chdir(tmp_path)  # neptune keeps offline runs in ./.neptune
    return monkeypatch


def operations(tmp_path) -> list[dict]:
    (run_dir,) = glob.glob(str(tmp_path / ".neptune" / "offline" / "run__*"))
    ops = []
    for path in sorted(glob.glob(os.path.join(run_dir, "data-*.log"))):
        with open(path) as f:
            ops += [json.loads(line)["obj"] for line in f if line.strip()]
    return ops


def series(ops, path) -> list[tuple[int, float]]:
    return [(v["step"], v["value"]) for op in ops if op["path"] == path for v in op.get("values", [])]


def test_offline_run_parameters_and_metric_series(offline, tmp_path):
    reporter = NeptuneCallback(**QUIET)
    drive(
        reporter, make_args(tmp_path / "out", run_name="nep-run", learning_rate=3e-4), LOGS, model=TinyModel()
    )
    assert reporter.run is None  # stopped at the end of training
    ops = operations(tmp_path)
    assigned = {"/".join(op["path"]): op.get("value") for op in ops if op["type"].startswith("Assign")}
    assert assigned["sys/name"] == "nep-run"
    assert assigned["finetuning/trainer_parameters/learning_rate"] == 3e-4
    assert assigned["finetuning/model_parameters/hidden_size"] == 4
    assert series(ops, ["finetuning", "train", "loss"]) == [(2, 1.5), (4, 1.0)]
    assert series(ops, ["finetuning", "eval", "loss"]) == [(4, 1.25)]


def test_checkpoint_upload_modes(offline, tmp_path):
    reporter = NeptuneCallback(log_checkpoints="last", base_namespace="ft", **QUIET)
    drive(reporter, make_args(tmp_path / "out"), LOGS[:2], save_steps=[2, 4])
    ops = operations(tmp_path)
    uploads = [("/".join(op["path"]), op["file_globs"]) for op in ops if op["type"] == "UploadFileSet"]
    checkpoint_uploads = [u for u in uploads if u[0].startswith("ft/checkpoints")]
    assert [u[0] for u in checkpoint_uploads] == [
        "ft/checkpoints/checkpoint-2",
        "ft/checkpoints/checkpoint-4",
    ]
    assert checkpoint_uploads[1][1] == [str(tmp_path / "out" / "checkpoint-4" / "*")]
    deleted = ["/".join(op["path"]) for op in ops if op["type"] == "DeleteAttribute"]
    assert deleted == ["ft/checkpoints/checkpoint-2"]  # "last" keeps only the newest


def test_best_mode_uploads_only_the_best_checkpoint(offline, tmp_path):
    reporter = NeptuneCallback(log_checkpoints="best", **QUIET)
    state = make_state(best_model_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    drive(reporter, make_args(tmp_path / "out"), LOGS[:2], save_steps=[2, 4], state=state)
    uploads = ["/".join(op["path"]) for op in operations(tmp_path) if op["type"] == "UploadFileSet"]
    assert [u for u in uploads if "checkpoints" in u] == ["finetuning/checkpoints/checkpoint-2"]


def test_given_run_is_left_open_and_bad_mode_rejected(offline, tmp_path):
    import neptune

    run = neptune.init_run(**QUIET)
    drive(NeptuneCallback(run=run, log_parameters=False), make_args(tmp_path), LOGS[:1])
    run["after"] = 1  # still usable
    run.stop()
    ops = operations(tmp_path)
    assert series(ops, ["finetuning", "train", "loss"]) == [(2, 1.5)]
    assert not any(op["path"][:2] == ["finetuning", "trainer_parameters"] for op in ops)
    with pytest.raises(ValueError, match="log_checkpoints='every'"):
        NeptuneCallback(log_checkpoints="every")

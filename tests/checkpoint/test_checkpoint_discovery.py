"""Finding and keeping checkpoints: verification of a folder against its marker and its files,
discovery of the newest complete checkpoint (transformers' folders too), sorting and rotation."""

from __future__ import annotations

import os
import pathlib
import warnings

import pytest
from checkpoint_kit import adamw, fake_checkpoint, hidden_entries, mlp, write_files

import trainwright.checkpoint as ckpt
from trainwright.checkpoint import folder


def test_verify_reports_missing_and_resized_files(tmp_path):
    path = ckpt.write_checkpoint(tmp_path, "checkpoint-3", write_files({"a.bin": b"123", "b.bin": b"4"}))
    pathlib.Path(path, "a.bin").write_bytes(b"12")
    os.unlink(os.path.join(path, "b.bin"))
    assert ckpt.verify_checkpoint(path) == ["a.bin has 2 bytes, expected 3", "b.bin is missing"]
    pathlib.Path(path, "checkpoint_complete.json").write_text("{")
    assert "checkpoint_complete.json is unreadable" in ckpt.verify_checkpoint(path)[0]


def test_get_last_checkpoint_skips_damaged_and_accepts_transformers_folders(tmp_path):
    assert ckpt.get_last_checkpoint(tmp_path / "absent") is None
    assert ckpt.get_last_checkpoint(tmp_path) is None
    hf = tmp_path / "checkpoint-5"  # written by transformers: no marker
    hf.mkdir()
    (hf / "trainer_state.json").write_text('{"global_step": 0}')
    (hf / "model.safetensors").write_bytes(b"x")
    partial = tmp_path / "checkpoint-20"  # a transformers save that crashed before trainer_state.json
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"x")
    damaged = fake_checkpoint(tmp_path, 10)
    pathlib.Path(damaged, "model.safetensors").write_bytes(b"")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ckpt.get_last_checkpoint(tmp_path) == str(hf)
    assert [str(w.message) for w in caught] == [
        f"skipping incomplete checkpoint {partial}: trainer_state.json is missing",
        f"skipping incomplete checkpoint {damaged}: model.safetensors has 0 bytes, expected 1",
    ]
    (tmp_path / "checkpoint-30.txt").write_text("not a folder")
    good = fake_checkpoint(tmp_path, 11)
    with pytest.warns(UserWarning, match="checkpoint-20"):
        assert ckpt.get_last_checkpoint(tmp_path) == good


def test_check_checkpoint_files(tmp_path):
    model = mlp()
    opt, sched = adamw(model)

    def write(tmp):
        ckpt.save_model_weights(model, tmp)
        ckpt.save_torch_state(opt.state_dict(), os.path.join(tmp, ckpt.OPTIMIZER_NAME))
        ckpt.save_torch_state(sched.state_dict(), os.path.join(tmp, ckpt.SCHEDULER_NAME))
        ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), {"global_step": 1})
        ckpt.save_rng_state(tmp)

    path = ckpt.write_checkpoint(tmp_path, "checkpoint-1", write)
    assert ckpt.check_checkpoint_files(path) == []
    assert ckpt.check_checkpoint_files(path, need=("model", "rng")) == []
    assert ckpt.check_checkpoint_files(path, need=("rng",), rank=1, world_size=2) == [
        f"rng_state_1.pth is missing (in {path})"
    ]
    problems = ckpt.check_checkpoint_files(path, need=("scaler", "data_state"))
    assert problems == [f"scaler.pt is missing (in {path})", f"data_state.json is missing (in {path})"]

    weights = pathlib.Path(path, "model.safetensors")
    weights.write_bytes(weights.read_bytes()[:-10])
    pathlib.Path(path, ckpt.OPTIMIZER_NAME).write_bytes(b"garbage")
    pathlib.Path(path, ckpt.TRAINER_STATE_NAME).write_text("{]")
    problems = ckpt.check_checkpoint_files(path)
    assert any("model.safetensors has" in p and "bytes" in p and path in p for p in problems)
    assert any(p.startswith("optimizer.pt is corrupt") for p in problems)
    assert any("trainer_state.json is not valid JSON" in p for p in problems)
    with pytest.raises(ValueError, match="unknown need \\['weights'\\]"):
        ckpt.check_checkpoint_files(path, need=("weights",))
    assert ckpt.check_checkpoint_files(tmp_path / "nope") == [
        f"checkpoint folder {tmp_path / 'nope'} does not exist"
    ]


def test_truncated_safetensors_is_detected_without_marker(tmp_path):
    ckpt.save_model_weights(mlp(), tmp_path)
    (tmp_path / "trainer_state.json").write_text('{"global_step": 0}')
    assert ckpt.check_checkpoint_files(tmp_path, need=("model",)) == []
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4])
    (problem,) = ckpt.check_checkpoint_files(tmp_path, need=("model",))
    assert "model.safetensors has" in problem and "its header describes" in problem


@pytest.fixture
def five_checkpoints(tmp_path):
    for step in (5, 10, 15, 20, 25):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-final").mkdir()  # not a step: never touched
    return tmp_path


def _steps(folder) -> set[int]:
    return {
        int(n.split("-")[1])
        for n in os.listdir(folder)
        if n.split("-")[-1].isdigit() and not n.startswith(".")
    }


def test_sort_checkpoints(five_checkpoints):
    out = five_checkpoints
    names = [os.path.basename(p) for p in ckpt.sort_checkpoints(out)]
    assert names == ["checkpoint-5", "checkpoint-10", "checkpoint-15", "checkpoint-20", "checkpoint-25"]
    best = str(out / "checkpoint-10")
    names = [os.path.basename(p) for p in ckpt.sort_checkpoints(out, best_model_checkpoint=best)]
    assert names == ["checkpoint-5", "checkpoint-15", "checkpoint-20", "checkpoint-10", "checkpoint-25"]

    for i, step in enumerate((5, 10, 15, 20, 25)):  # oldest mtime on the highest step
        os.utime(out / f"checkpoint-{step}", (1_000_000 - 10 * i, 1_000_000 - 10 * i))
    names = [os.path.basename(p) for p in ckpt.sort_checkpoints(out, use_mtime=True)]
    assert names == ["checkpoint-25", "checkpoint-20", "checkpoint-15", "checkpoint-10", "checkpoint-5"]
    for step in (5, 10, 15, 20, 25):
        os.utime(out / f"checkpoint-{step}", (1_000_000, 1_000_000 + step / 100))
    with pytest.warns(UserWarning, match="ordering checkpoints by step"):
        names = [os.path.basename(p) for p in ckpt.sort_checkpoints(out, use_mtime=True)]
    assert names[0] == "checkpoint-5" and names[-1] == "checkpoint-25"


@pytest.mark.parametrize(
    ("limit", "best", "kept"),
    [
        (2, None, {20, 25}),
        (2, 5, {5, 25}),
        (1, 25, {25}),
        (1, 5, {5, 25}),
        (None, None, {5, 10, 15, 20, 25}),
        (0, None, {5, 10, 15, 20, 25}),
        (10, None, {5, 10, 15, 20, 25}),
    ],
)
def test_rotate_checkpoints_outcomes(five_checkpoints, limit, best, kept):
    out = five_checkpoints
    best_path = None if best is None else str(out / f"checkpoint-{best}")
    deleted = ckpt.rotate_checkpoints(out, save_total_limit=limit, best_model_checkpoint=best_path)
    assert _steps(out) == kept
    assert {int(p.rsplit("-", 1)[1]) for p in deleted} == {5, 10, 15, 20, 25} - kept
    assert hidden_entries(out) == [] and (out / "checkpoint-final").is_dir()


def test_deletion_hides_the_folder_before_removing_it(tmp_path, monkeypatch):
    fake_checkpoint(tmp_path, 1)
    newest = fake_checkpoint(tmp_path, 2)
    # Simulate a crash after the rename, before the removal finished.
    monkeypatch.setattr(folder.shutil, "rmtree", lambda *a, **k: None)
    assert ckpt.rotate_checkpoints(tmp_path, save_total_limit=1) == [str(tmp_path / "checkpoint-1")]
    (hidden,) = hidden_entries(tmp_path)
    assert hidden.startswith(".checkpoint-1.trash-")
    assert ckpt.sort_checkpoints(tmp_path) == [newest]
    monkeypatch.undo()
    ckpt.clean_checkpoint_leftovers(tmp_path)
    assert hidden_entries(tmp_path) == []

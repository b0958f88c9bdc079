"""Nothing of another run is lost through `output_dir`: the end of a `save_total_limit=1` run keeps
what rotation keeps, and a run whose `output_dir` was removed, renamed or replaced by a link while it
trained stops at its next save with an error naming the folder, writing and deleting nothing (real
processes: the folder is changed under a running job)."""

from __future__ import annotations

import os
import shutil
import subprocess

import torch
from conftest import RegressionDataset
from kit.runs import read_until, regression_trainer, start_resume_job

import trainwright


def _another_runs_checkpoint(folder) -> str:
    """checkpoint-100 of an earlier run, complete (with its manifest)."""
    args = trainwright.TrainingArguments(
        output_dir=str(folder), max_steps=1, save_steps=1, report_to="none", use_cpu=True, disable_tqdm=True
    )
    regression_trainer(args).train()
    done = os.path.join(str(folder), "checkpoint-100")
    os.rename(os.path.join(str(folder), "checkpoint-1"), done)
    return done


def test_the_end_of_a_limit_1_run_keeps_another_runs_checkpoints(tmp_path):
    out = tmp_path / "out"
    other = _another_runs_checkpoint(tmp_path / "earlier")
    shutil.copytree(other, out / "checkpoint-100")
    args = trainwright.TrainingArguments(
        output_dir=str(out),
        max_steps=6,
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_total_limit=1,
        load_best_model_at_end=True,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = regression_trainer(args, RegressionDataset(16))
    trainer.train()
    kept = sorted(p for p in os.listdir(out) if p.startswith("checkpoint-"))
    assert "checkpoint-100" in kept  # another run's, kept as the start of the run said
    assert os.path.basename(trainer.state.best_model_checkpoint) in kept
    assert len(kept) == 2


def _run_until_saved(out, extra: dict | None = None) -> subprocess.Popen:
    cfg = {"output_dir": str(out), "announce": True, "announce_pause": 0.4, "save_steps": 2, "epochs": 4}
    cfg.update(extra or {})
    proc = start_resume_job(cfg)
    if read_until(proc, "STEP 4"):  # checkpoint-2 is on disk
        return proc
    raise AssertionError(f"the job ended early:\n{proc.stderr.read()[-3000:] if proc.stderr else ''}")


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def test_a_removed_output_dir_stops_the_run_and_is_not_recreated(tmp_path):
    out = tmp_path / "out"
    proc = _run_until_saved(out)
    shutil.rmtree(out)
    code, err = _finish(proc)
    assert code != 0 and "is not the folder this run locked" in err and str(out) in err, err[-3000:]
    assert not out.exists()  # not recreated: a second run could be using it unlocked


def test_a_renamed_output_dir_keeps_its_checkpoints(tmp_path):
    out, moved = tmp_path / "out", tmp_path / "moved"
    proc = _run_until_saved(out, {"save_total_limit": 1})
    os.rename(out, moved)
    code, err = _finish(proc)
    assert code != 0 and "no longer exists" in err, err[-3000:]
    assert (moved / "checkpoint-2").is_dir() and not out.exists()


def test_a_link_in_place_of_output_dir_leaves_its_targets_checkpoints_alone(tmp_path):
    out, theirs = tmp_path / "out", tmp_path / "theirs"
    _another_runs_checkpoint(theirs)
    shutil.copytree(theirs / "checkpoint-100", theirs / "checkpoint-1")
    before = sorted(os.listdir(theirs))
    proc = _run_until_saved(out, {"save_total_limit": 1})
    os.rename(out, tmp_path / "out-old")
    os.symlink(theirs, out)
    code, err = _finish(proc)
    assert code != 0 and "another folder (or a link to one) is in its place" in err, err[-3000:]
    assert sorted(os.listdir(theirs)) == before  # rotation deleted nothing of the other run
    assert torch.load(theirs / "checkpoint-1" / "rng_state.pth", weights_only=True)  # still whole

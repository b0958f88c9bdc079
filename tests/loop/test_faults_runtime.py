"""Faults a hostile user causes at run time (issue 9, items 10-12, 14, 15), with real processes,
signals, files and, where this user may mount, real filesystems:

- two runs writing one output_dir (advisory lock; a SIGKILLed holder does not block the next run);
- an output_dir that cannot be written (found when training starts, not at the first save);
- a full disk while writing a checkpoint (the error names checkpoint, file and cause; the previous
  checkpoint stays the newest complete one);
- Ctrl-C (saves like SIGTERM; a second Ctrl-C aborts and leaves no hidden folder), a stuck dataloader
  worker (dataloader_timeout);
- SIGTERM during a long evaluation (stops at the next batch, saves).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import time
import warnings

import pytest
import torch
from kit.faults import Data, Net, check_full_disk_error, fault_trainer, hidden, mounted_tmpfs
from torch import nn
from torch.utils.data import Dataset

import trainwright.checkpoint as ckpt
from trainwright import TrainerCallback, TrainingArguments
from trainwright.checkpoint import files as checkpoint_io
from trainwright.checkpoint import folder, weights
from trainwright.core import output_lock
from trainwright.core.output_lock import RECORD_ATTR, OutputDirError, OutputDirInUseError

# ----------------------------------------------------------------------------------------- helpers


# ------------------------------------------------------------------- 10: one writer per output_dir


def test_second_process_is_refused_while_the_first_trains(tmp_path, jobs):
    out = str(tmp_path / "out")
    first = jobs({"output_dir": out, "max_steps": 10_000, "step_sleep": 0.05})
    pid = int(first.wait_for("STARTED").split()[1])
    holder = json.loads(os.getxattr(out, RECORD_ATTR))  # the record; nothing is written into out
    assert holder["pid"] == pid and holder["host"] and holder["started"]

    second = jobs({"output_dir": out, "max_steps": 2, "save_steps": 1})
    code, stdout, stderr = second.finish()
    assert code != 0 and "STARTED" not in stdout  # refused before its loop began
    assert "OutputDirInUseError" in stderr
    assert f"output_dir={out!r} is in use by another training run (pid {pid} on host" in stderr
    assert os.listdir(out) == []  # the second run wrote nothing

    first.proc.send_signal(signal.SIGTERM)  # the first one is unharmed: it saves and exits cleanly
    code, stdout, stderr = first.finish()
    assert code == 0, stderr[-3000:]
    assert ckpt.get_last_checkpoint(out) is not None
    assert RECORD_ATTR not in os.listxattr(out)  # released (and its record removed) on exit


def test_sigkilled_holder_does_not_block_the_next_run(tmp_path, jobs):
    out = str(tmp_path / "out")
    # with dataloader workers: forked from the trainer, they outlive its SIGKILL for a few seconds
    first = jobs({"output_dir": out, "max_steps": 10_000, "step_sleep": 0.05, "workers": 2})
    first.wait_for("STEP 2")
    os.kill(first.proc.pid, signal.SIGKILL)
    assert first.proc.wait(timeout=60) == -signal.SIGKILL
    assert os.listdir(out) == []  # nothing left in the folder; the kernel dropped the lock

    code, stdout, stderr = jobs({"output_dir": out, "max_steps": 2, "save_steps": 1}).finish()
    assert code == 0, stderr[-3000:]
    assert "DONE 2" in stdout
    assert ckpt.get_last_checkpoint(out).endswith("checkpoint-2")


def test_lock_in_process_conflict_release_and_unsupported_filesystem(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    os.makedirs(out)
    with output_lock.OutputDirLock(out) as held:
        assert held.locked
        with pytest.raises(OutputDirInUseError, match=f"pid {os.getpid()} on host") as info:
            output_lock.OutputDirLock(out).acquire()  # a second open file description conflicts too
        assert info.value.holder["pid"] == os.getpid()
        with pytest.raises(OutputDirInUseError, match="is in use by another training run"):
            fault_trainer(out).train()
    assert os.listdir(out) == []
    fault_trainer(out).train()  # released: the next run goes ahead
    assert RECORD_ATTR not in os.listxattr(out)

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(output_lock.fcntl, "flock", no_flock)
    unsupported = str(tmp_path / "nfs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fault_trainer(unsupported).train()
        fault_trainer(unsupported).train()
    said = [str(w.message) for w in caught if "cannot be locked" in str(w.message)]
    assert len(said) == 1 and "No locks available" in said[0] and unsupported in said[0]  # once, then on
    assert ckpt.get_last_checkpoint(unsupported).endswith("checkpoint-4")


# ------------------------------------------------------------- 11: output_dir checked at the start


class _CountSteps(TrainerCallback):
    steps = 0

    def on_step_begin(self, args, state, control, **kw):
        _CountSteps.steps += 1


def _refused_before_a_step(output_dir: str, match: str) -> None:
    """Refused by the constructor (which creates output_dir, as upstream's) or when train() starts."""
    _CountSteps.steps = 0
    with pytest.raises(OutputDirError, match=match):
        trainer = fault_trainer(output_dir)
        trainer.add_callback(_CountSteps)
        trainer.train()
    assert _CountSteps.steps == 0


def test_output_dir_that_is_a_file_or_empty(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    _refused_before_a_step(str(blocker), f"output_dir={str(blocker)!r} is a file, not a folder")
    assert blocker.read_text() == "not a folder"
    _refused_before_a_step(
        str(blocker / "out"), f"output_dir={str(blocker / 'out')!r} cannot be created: Not a directory"
    )
    _refused_before_a_step("", r"output_dir is empty \(''\)")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_output_dir_under_a_read_only_folder_chmod(tmp_path):
    parent = tmp_path / "locked"
    parent.mkdir()
    os.chmod(parent, 0o500)
    try:
        _refused_before_a_step(str(parent / "out"), "cannot be created: Permission denied")
        _refused_before_a_step(str(parent), "is not writable: Permission denied")
    finally:
        os.chmod(parent, 0o755)


def test_output_dir_on_a_read_only_mount(tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        _refused_before_a_step(
            os.path.join(ro, "out"),
            f"output_dir={os.path.join(ro, 'out')!r} cannot be created: Read-only file system.*read-only",
        )
        _refused_before_a_step(ro, f"output_dir={ro!r} is not writable: Read-only file system")


def test_output_dir_not_writable_monkeypatched(tmp_path, monkeypatch):
    """The same refusal for a user who may neither chmod effectively nor mount: the probe write fails."""
    real_open = os.open

    def refuse_probe(path, flags, mode=0o777, **kw):
        if os.path.basename(os.fspath(path)).startswith(".trainwright-write-probe-"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", refuse_probe)
    out = str(tmp_path / "out")
    _refused_before_a_step(
        out, f"output_dir={out!r} is not writable: Permission denied .*give this user write permission"
    )
    assert os.listdir(out) == []  # no probe left behind


# ----------------------------------------------------------------------------- 12: a full disk


def test_disk_full_on_a_real_tmpfs_keeps_the_previous_checkpoint(tmp_path):
    # An 80k-parameter model: weights 320 KiB, AdamW state 645 KiB, a checkpoint ~1 MiB. On a
    # 1.56 MiB disk the first fits; the second fails in optimizer.pt (torch's serializer error).
    with mounted_tmpfs(tmp_path / "disk", "1600k") as out:
        trainer = fault_trainer(out, model=Net(width=8000), max_steps=4, save_steps=2)
        with pytest.raises(ckpt.CheckpointError) as info:
            trainer.train()
        check_full_disk_error(info.value, out, "checkpoint-4", "optimizer.pt")
        assert "RuntimeError" in str(info.value)  # what torch said is kept, after the plain cause
        assert sorted(os.listdir(out)) == ["checkpoint-2"]  # no hidden folder, no lock left
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert ckpt.get_last_checkpoint(out) == os.path.join(out, "checkpoint-2")
        assert ckpt.check_checkpoint_files(os.path.join(out, "checkpoint-2")) == []

        # safetensors on the same full disk: the weights file is named too
        big = nn.Linear(1000, 1000)
        with pytest.raises(ckpt.CheckpointError) as info:
            ckpt.write_checkpoint(out, "checkpoint-9", lambda tmp: ckpt.save_model_weights(big, tmp))
        check_full_disk_error(info.value, out, "checkpoint-9", "model.safetensors")
        assert sorted(os.listdir(out)) == ["checkpoint-2"]

        # outside a checkpoint (save_model at the end of a run) the file and the cause are named too
        final = os.path.join(out, "final")
        trainer.model = big  # 4 MB of weights
        with pytest.raises(checkpoint_io.CheckpointWriteError) as info:
            trainer.save_model(final)
        assert str(info.value).startswith(
            f"could not write {os.path.join(final, 'model.safetensors')}: No space left on device"
        )
        assert "the disk is full" in str(info.value) and info.value.disk_full


def test_disk_full_errors_monkeypatched(tmp_path, monkeypatch):
    """torch's and safetensors' errors as they are raised on a full disk, wherever mounting is refused."""
    out = str(tmp_path / "out")
    fault_trainer(out, max_steps=2, save_steps=2).train()

    def torch_full(obj, f, *a, **kw):
        with open(f, "wb") as fh:
            fh.write(b"PK partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(torch, "save", torch_full)
    monkeypatch.setattr(checkpoint_io, "_free_bytes", lambda path: 0)  # what statvfs says on that full disk
    with pytest.raises(ckpt.CheckpointError) as info:
        fault_trainer(out, max_steps=4, save_steps=4).train(resume_from_checkpoint=True)
    check_full_disk_error(info.value, out, "checkpoint-4", "while writing training_args.bin")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert sorted(os.listdir(out)) == ["checkpoint-2"]

    # the same torch error with space left is still wrapped, naming the file, not called a full disk
    monkeypatch.setattr(checkpoint_io, "_free_bytes", lambda path: 10**12)
    with pytest.raises(
        ckpt.CheckpointError, match=r"'checkpoint-4' .*RuntimeError: \[enforce fail.*training_args\.bin"
    ):
        fault_trainer(out, max_steps=4, save_steps=4).train(resume_from_checkpoint=True)
    monkeypatch.undo()

    from safetensors import SafetensorError

    def safetensors_full(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"partial")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(weights, "save_file", safetensors_full)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.write_checkpoint(out, "checkpoint-5", lambda tmp: ckpt.save_model_weights(Net(), tmp))
    check_full_disk_error(info.value, out, "checkpoint-5", "while writing model.safetensors")
    assert sorted(os.listdir(out)) == ["checkpoint-2"]


# ------------------------------------------------------------------ 14: Ctrl-C and stuck workers


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_ctrl_c_saves_and_exits_0_even_with_workers(tmp_path, jobs, start_method):
    """Ctrl-C in a terminal signals the whole process group: the workers ignore it, the main
    process finishes the step, saves and exits 0. Loading is the slow part here, so the main process
    is waiting for the worker's next batch when the signal comes: a spawned worker that took the
    KeyboardInterrupt would never send it; a forked one that kept the trainer's handler would log the
    request a second time."""
    out = str(tmp_path / "out")
    job = jobs(
        {
            "output_dir": out,
            "max_steps": 10_000,
            "train_item_sleep": 0.05,  # 0.2 s per batch of 4
            "workers": 1,
            "mp_context": start_method,
        }
    )
    job.wait_for("STEP 3")
    time.sleep(0.1)  # step 3 is done in a few ms: the main process now waits for batch 4
    os.killpg(job.proc.pid, signal.SIGINT)
    code, stdout, stderr = job.finish()
    assert code == 0, stderr[-3000:]
    assert "KeyboardInterrupt" not in stderr and stderr.count("Received SIGINT") == 1, stderr[-3000:]
    last = ckpt.get_last_checkpoint(out)
    step = int(last.rsplit("-", 1)[1])
    assert step >= 4 and f"STEP {step + 1}" not in stdout  # the step ended, then it stopped
    assert ckpt.verify_checkpoint(last) == [] and hidden(out) == []
    assert sorted(os.listdir(out)) == [os.path.basename(last)]


def test_second_ctrl_c_aborts_a_save_at_once_and_leaves_no_hidden_folder(tmp_path, jobs):
    out = str(tmp_path / "out")
    job = jobs({"output_dir": out, "max_steps": 10_000, "save_steps": 2, "save_sleep": 600})
    job.wait_for("IN_SAVE 2")  # inside the checkpoint's write, the weights written
    assert len(hidden(out)) == 1
    job.proc.send_signal(signal.SIGINT)  # recorded: the save goes on
    time.sleep(0.5)
    assert job.proc.poll() is None
    sent = time.monotonic()
    job.proc.send_signal(signal.SIGINT)  # aborts now
    code, _, stderr = job.finish()
    assert time.monotonic() - sent < 60  # not the 600 s the save would still take
    assert code != 0 and "KeyboardInterrupt" in stderr
    assert "aborting without a checkpoint" in stderr
    assert hidden(out) == [] and ckpt.get_last_checkpoint(out) is None
    assert os.listdir(out) == []  # and the lock is released


def test_write_checkpoint_cleans_up_on_keyboard_interrupt_and_system_exit(tmp_path, monkeypatch):
    earlier = ckpt.write_checkpoint(tmp_path, "checkpoint-1", lambda tmp: ckpt.save_model_weights(Net(), tmp))

    for exc in (KeyboardInterrupt, SystemExit(3)):

        def interrupted(tmp, exc=exc):
            ckpt.save_model_weights(Net(), tmp)
            raise exc

        with pytest.raises(type(exc) if isinstance(exc, BaseException) else exc):
            ckpt.write_checkpoint(tmp_path, "checkpoint-2", interrupted)
        assert sorted(os.listdir(tmp_path)) == ["checkpoint-1"]

    real_fsync_dir = folder.fsync_dir

    def interrupt_commit(path):  # Ctrl-C while the folder is being committed
        if os.path.basename(os.fspath(path)).startswith(".checkpoint-"):
            raise KeyboardInterrupt
        return real_fsync_dir(path)

    monkeypatch.setattr(folder, "fsync_dir", interrupt_commit)
    for name in ("checkpoint-2", "checkpoint-1"):  # a new one, and one replacing a checkpoint
        with pytest.raises(KeyboardInterrupt):
            ckpt.write_checkpoint(tmp_path, name, lambda tmp: ckpt.save_model_weights(Net(), tmp))
        assert sorted(os.listdir(tmp_path)) == ["checkpoint-1"]
    assert ckpt.get_last_checkpoint(tmp_path) == earlier


class _StuckAt(Dataset):
    def __init__(self, stuck: int) -> None:
        self.data, self.stuck = Data(), stuck

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        if i == self.stuck:
            time.sleep(3600)  # a worker that never answers
        return self.data[i]


def test_stuck_dataloader_worker_fails_naming_dataloader_timeout(tmp_path):
    trainer = fault_trainer(
        str(tmp_path / "out"),
        dataset=_StuckAt(stuck=5),
        dataloader_num_workers=1,
        dataloader_timeout=3,
        train_sampling_strategy="sequential",
        max_steps=8,
        save_steps=1000,
    )
    with pytest.raises(RuntimeError, match=r"dataloader_timeout=3\).*stuck or too slow") as info:
        trainer.train()
    assert "DataLoader timed out after 3" in str(info.value.__cause__)
    # the first batch (items 0-3) came; the second never did, and it is fetched before the first step
    # trains (one batch ahead, as accelerate's loader fetches it under transformers)
    assert trainer.state.global_step == 0


def test_dataloader_timeout_argument():
    assert TrainingArguments(output_dir="x").dataloader_timeout == 0
    with pytest.raises(ValueError, match="dataloader_timeout=-1 is invalid"):
        TrainingArguments(output_dir="x", dataloader_timeout=-1)
    with pytest.raises(
        ValueError, match="dataloader_timeout=5 is invalid: only applies with dataloader_num_workers"
    ):
        TrainingArguments(output_dir="x", dataloader_timeout=5)
    assert (
        TrainingArguments(output_dir="x", dataloader_num_workers=1, dataloader_timeout=2.5).dataloader_timeout
        == 2.5
    )


# ------------------------------------------------------------- 15: SIGTERM during a long evaluation


def test_sigterm_during_a_long_evaluation_stops_it_at_the_next_batch(tmp_path, jobs):
    """A 15 s evaluation (60 batches of 0.25 s) every 2 steps; SIGTERM at its first batch. Waiting for
    it would take ~15 s more; the run must save and exit within one batch plus the save."""
    out = str(tmp_path / "out")
    job = jobs(
        {"output_dir": out, "max_steps": 100, "eval_items": 60, "eval_item_sleep": 0.25, "eval_steps": 2}
    )
    job.wait_for("EVAL_BATCH 1")
    sent = time.monotonic()
    job.proc.send_signal(signal.SIGTERM)
    code, stdout, stderr = job.finish()
    took = time.monotonic() - sent
    assert code == 0, stderr[-3000:]
    # at most the batch in flight when the signal came, whatever the machine's load
    assert "EVAL_BATCH 3" not in stdout
    assert took < 6.0, f"{took:.1f} s from SIGTERM to exit"  # generous: one batch is 0.25 s
    assert "Evaluation stopped by SIGTERM after" in stderr and "no evaluation metrics for step 2" in stderr
    last = ckpt.get_last_checkpoint(out)
    assert last == os.path.join(out, "checkpoint-2") and ckpt.verify_checkpoint(last) == []
    assert sorted(os.listdir(out)) == ["checkpoint-2"]
    state = json.loads(open(os.path.join(last, "trainer_state.json")).read())
    assert not any("eval_loss" in row for row in state["log_history"])  # no partial metrics recorded


def _weights_of(folder: str) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def test_sigterm_during_an_evaluation_saves_once_and_the_resume_evaluates_it_first(tmp_path, jobs):
    """The evaluation cut short by SIGTERM is neither run again nor saved twice in that process;
    what it drew from the random streams goes back before the checkpoint is written, and the
    resumed run evaluates that step first: it ends with the weights of a run never stopped, with
    the same evaluations (dropout in training, and evaluation items that draw random noise)."""
    common = {"eval_items": 8, "eval_steps": 2, "eval_augment": True, "dropout": 0.3, "max_steps": 6}
    whole = jobs({**common, "output_dir": str(tmp_path / "whole"), "final": str(tmp_path / "whole_final")})
    code, whole_out, err = whole.finish()
    assert code == 0, err[-3000:]

    out = str(tmp_path / "out")
    job = jobs({**common, "output_dir": out, "eval_item_sleep": 0.25})
    job.wait_for("EVAL_BATCH 1")
    job.proc.send_signal(signal.SIGTERM)
    code, stdout, stderr = job.finish()
    assert code == 0, stderr[-3000:]
    assert [line for line in stdout.splitlines() if line.startswith("SAVED")] == ["SAVED 2"]
    assert "EVALUATED" not in stdout and "a resume evaluates it first" in stderr
    assert sorted(os.listdir(out)) == ["checkpoint-2"]

    final = str(tmp_path / "resumed_final")
    resumed = jobs({**common, "output_dir": out, "resume": os.path.join(out, "checkpoint-2"), "final": final})
    code, resumed_out, err = resumed.finish()
    assert code == 0, err[-3000:]
    evaluated = [line for line in resumed_out.splitlines() if line.startswith("EVALUATED")]
    assert evaluated == ["EVALUATED 2", "EVALUATED 4", "EVALUATED 6"]
    whole_weights, resumed_weights = _weights_of(str(tmp_path / "whole_final")), _weights_of(final)
    assert all(torch.equal(whole_weights[k], resumed_weights[k]) for k in whole_weights)


def test_sigterm_mid_epoch_with_epoch_saves_writes_its_checkpoint_once(tmp_path, jobs):
    """A preemption mid-epoch saves that step; the epoch's end events then fire (as upstream's loop
    does when it stops) and ask for the epoch's save of the same step: it is not written again."""
    out = str(tmp_path / "out")
    job = jobs({"output_dir": out, "max_steps": 100, "save_strategy": "epoch", "step_sleep": 0.2})
    job.wait_for("STEP 3")
    job.proc.send_signal(signal.SIGTERM)
    code, stdout, stderr = job.finish()
    assert code == 0, stderr[-3000:]
    saved = [line for line in stdout.splitlines() if line.startswith("SAVED")]
    assert len(saved) == 1 and sorted(os.listdir(out)) == [f"checkpoint-{saved[0].split()[1]}"]


# ---------------------------------------------------- 10 with torchrun: only the writer locks, all ranks stop


def test_torchrun_job_on_a_locked_output_dir_stops_every_rank(tmp_path):
    """Rank 0 (the writing process) finds output_dir locked by this test; rank 1 takes no lock but
    learns the outcome, so both raise at once instead of rank 1 waiting in a collective."""
    from kit.torchrun import torchrun

    out = tmp_path / "dist"
    os.makedirs(out / "locked")
    with output_lock.OutputDirLock(str(out / "locked")):
        code, log = torchrun({"out": str(out), "tasks": [{"name": "locked"}]}, check=False, timeout=180)
    assert code != 0, log[-3000:]
    assert "OutputDirInUseError" in log and f"(pid {os.getpid()} on host" in log, log[-3000:]
    assert "OutputDirError: rank 0: output_dir=" in log, log[-3000:]  # rank 1's error: rank 0's outcome
    assert os.listdir(out / "locked") == []  # nothing written, and the test's lock released

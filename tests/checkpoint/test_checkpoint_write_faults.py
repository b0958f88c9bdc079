"""Write faults of a checkpoint that used to surface bare or untrue (issue 18, items 13 and 14):

- a full disk hit at the end of a small file (`scheduler.pt`, `rng_state.pth`, `trainer_state.json`),
  synchronous and `async_save`, on a real tmpfs filled up to the byte (skipped where this user may
  not mount); an error that a network filesystem reports only at fsync;
- a second Ctrl-C while a checkpoint is written in the background: the write is discarded, as the
  message says, and a synchronous save's is.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from kit import JOBS, TESTS
from kit.faults import Data, Net, mounted_tmpfs

import trainwright.checkpoint as ckpt
from trainwright import Trainer, TrainerCallback, TrainingArguments
from trainwright.checkpoint.async_writer import AsyncCheckpointError, AsyncCheckpointWriter
from trainwright.core import files as core_files

PAGE = 4096  # tmpfs hands out whole pages

# The files of a checkpoint of `Net`, in the order the manager writes them.
_ORDER = [
    "model.safetensors",
    "training_args.json",
    "training_args.bin",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
    "batch_in_hand.safetensors",  # the batch fetched ahead of the next step
    "data_state.json",
    "trainer_state.json",
]


def _pages(size: int) -> int:
    return -(-size // PAGE)


class _FillTheDisk(TrainerCallback):
    """Once checkpoint-2 is complete (`on_save`), fill its disk so that the next checkpoint (the same
    sizes) has room for every file before `target` and for all of `target` but its last page."""

    def __init__(self, disk: str, out: str, target: str) -> None:
        self.disk, self.out, self.target = disk, out, target

    def on_save(self, args, state, control, **kw):
        if state.global_step != 2:
            return
        first = os.path.join(self.out, "checkpoint-2")
        before = _ORDER[: _ORDER.index(self.target)]
        room = sum(_pages(os.path.getsize(os.path.join(first, n))) for n in before)
        room += _pages(os.path.getsize(os.path.join(first, self.target))) - 1
        st = os.statvfs(self.disk)
        free = st.f_bfree * st.f_frsize // PAGE
        with open(os.path.join(self.disk, "filler"), "wb") as f:
            f.write(b"\0" * (free - room) * PAGE)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("target", ["scheduler.pt", "rng_state.pth", "trainer_state.json"])
def test_a_full_disk_at_the_end_of_a_small_file_names_checkpoint_file_and_cause(tmp_path, target, async_save):
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        out = os.path.join(disk, "out")
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=4,
            max_steps=4,
            save_steps=2,
            async_save=async_save,
            report_to="none",
            disable_tqdm=True,
            use_cpu=True,
        )
        trainer = Trainer(
            model=Net(width=300),
            args=args,
            train_dataset=Data(),
            callbacks=[_FillTheDisk(disk, out, target)],
        )
        with pytest.raises(ckpt.CheckpointError) as info:
            trainer.train()
        text = str(info.value)
        assert f"could not write checkpoint 'checkpoint-4' in {out}: No space left on device" in text, text
        assert f"(while writing {target})" in text, text
        assert f"the disk of {out} is full" in text, text
        assert isinstance(info.value, AsyncCheckpointError) == async_save
        if target == "scheduler.pt":  # torch's own words, once bare, are kept after the plain cause
            assert "basic_ios::clear: iostream error" in text, text
        assert sorted(os.listdir(out)) == ["checkpoint-2"]  # no hidden folder left
        assert ckpt.get_last_checkpoint(out) == os.path.join(out, "checkpoint-2")


def test_an_error_reported_only_by_fsync_names_the_file(tmp_path, monkeypatch):
    """NFS and other network filesystems report a full disk or quota at fsync or close, not at write."""
    real_fsync = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("optimizer.pt"):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real_fsync(fd)

    monkeypatch.setattr(core_files.os, "fsync", fsync)

    def write(tmp):
        ckpt.save_model_weights(Net(), tmp)
        ckpt.save_torch_state({"step": 1}, os.path.join(tmp, "optimizer.pt"))

    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.write_checkpoint(tmp_path, "checkpoint-1", write)
    assert str(info.value).startswith(
        f"could not write checkpoint 'checkpoint-1' in {tmp_path}: {os.strerror(errno.EDQUOT)} "
        "(while writing optimizer.pt); the disk of"
    ), str(info.value)
    assert os.listdir(tmp_path) == []
    # outside a checkpoint too: the file is named
    path = tmp_path / "optimizer.pt"
    path.write_bytes(b"x")
    with pytest.raises(OSError, match="optimizer.pt"):
        core_files.fsync_file(path)


# A training job whose background writes are slow: each state file written on the writer thread
# takes 3 s more (printing IN_BACKGROUND_SAVE), so a second Ctrl-C lands while one is in flight.
_SLOW_WRITER_JOB = """
import json, sys, threading, time
sys.path.insert(0, {here!r})
import torch
from fault_job import Data, Net, Report
from trainwright import Trainer, TrainingArguments
from trainwright.checkpoint import manager

real = manager.CheckpointManager.write_state

def slow(self, folder, name, state):
    real(self, folder, name, state)
    if threading.current_thread().name == "trainwright-checkpoint-writer":
        print("IN_BACKGROUND_SAVE " + name, flush=True)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            time.sleep(0.05)

manager.CheckpointManager.write_state = slow
torch.set_num_threads(1)
args = TrainingArguments(
    output_dir=sys.argv[1], per_device_train_batch_size=4, max_steps=10_000, save_strategy="no",
    async_save=True, report_to="none", disable_tqdm=True, use_cpu=True,
)
torch.manual_seed(0)
Trainer(model=Net(), args=args, train_dataset=Data(64), callbacks=[Report(0.02)]).train()
"""


def _wait_for(proc: subprocess.Popen, prefix: str) -> None:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return
    raise AssertionError(
        f"no {prefix!r} line; exit {proc.wait()}; {lines[-5:]}; {proc.stderr.read()[-3000:]}"
    )


def test_a_second_ctrl_c_discards_a_background_write_as_it_says(tmp_path):
    out = str(tmp_path / "out")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER_JOB.format(here=str(JOBS)), out],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=TESTS,
        start_new_session=True,
    )
    try:
        _wait_for(proc, "STEP 3")
        proc.send_signal(signal.SIGINT)  # save at the end of this step (in the background), then stop
        _wait_for(proc, "IN_BACKGROUND_SAVE")  # the write is in flight
        assert [n for n in os.listdir(out) if n.startswith(".checkpoint-")], os.listdir(out)
        proc.send_signal(signal.SIGINT)  # abort now
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr, stderr[-3000:]
    assert "Received SIGINT again: aborting without a checkpoint" in stderr
    assert ckpt.get_last_checkpoint(out) is None, os.listdir(out)  # what the message said: no checkpoint
    assert os.listdir(out) == []  # no hidden folder, no lock
    assert "being written in the background, was discarded" in stderr, stderr[-3000:]


def test_a_cancelled_background_write_is_absent_and_a_finished_one_complete(tmp_path, caplog):
    """The writer's contract behind it: `drain(cancel=True)` stops a write at its next file without
    committing it; a write that already finished is kept; each outcome is said."""
    writer = AsyncCheckpointWriter()
    started = threading.Event()

    def files(tmp):
        ckpt.save_model_weights(Net(), tmp)
        started.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a slow file; save_checkpoint_async checks between files
            writer.check_cancelled(os.path.join(tmp_path, "checkpoint-1"))
            time.sleep(0.01)
        raise AssertionError("the write was never cancelled")

    writer.submit(
        str(tmp_path / "checkpoint-1"), lambda: ckpt.write_checkpoint(tmp_path, "checkpoint-1", files)
    )
    started.wait()
    with caplog.at_level(logging.WARNING, logger="trainwright.checkpoint.async_writer"):
        assert writer.drain(cancel=True) is None
    assert os.listdir(tmp_path) == []  # nothing committed, no hidden folder
    assert "checkpoint-1, being written in the background, was discarded" in caplog.text

    caplog.clear()
    writer.submit(
        str(tmp_path / "checkpoint-2"),
        lambda: ckpt.write_checkpoint(
            tmp_path, "checkpoint-2", lambda tmp: ckpt.save_model_weights(Net(), tmp)
        ),
    )
    while not writer.ready:
        time.sleep(0.01)
    with caplog.at_level(logging.WARNING, logger="trainwright.checkpoint.async_writer"):
        assert writer.drain(cancel=True) is None
    assert ckpt.verify_checkpoint(tmp_path / "checkpoint-2") == []
    assert (
        "checkpoint-2 was already being committed when the abort came; it is complete and kept" in caplog.text
    )

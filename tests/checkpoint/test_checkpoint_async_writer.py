"""The background checkpoint writer: files byte-identical to a synchronous save (as the manager writes
them too), completion work in the polling thread, errors raised in the training thread naming the
file, and at most one write in flight."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from checkpoint_kit import folder_files, trained

import trainwright.checkpoint as ckpt
from trainwright.checkpoint.async_writer import AsyncCheckpointError, AsyncCheckpointWriter


def _write_fn(model, state, max_shard_size="5GB"):
    """The file writers of a checkpoint, from `state` (a live state or a snapshot of it)."""

    def write(tmp: str) -> None:
        ckpt.save_model_weights(model, tmp, state_dict=state["model"], max_shard_size=max_shard_size)
        ckpt.save_torch_state(state["optimizer"], os.path.join(tmp, ckpt.OPTIMIZER_NAME))
        ckpt.save_torch_state(state["rng"], ckpt.rng_state_file(tmp))
        ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), state["trainer"])

    return write


def _async_save(writer, out, name, model, state, on_done=None, max_shard_size="5GB"):
    write = lambda copy: ckpt.write_checkpoint(out, name, _write_fn(model, copy, max_shard_size))  # noqa: E731
    writer.save(os.path.join(out, name), state, write, on_done)


@pytest.mark.parametrize("max_shard_size", ["5GB", 100])  # one file; shards and an index
@pytest.mark.parametrize("tied", [False, True])
def test_async_checkpoint_is_byte_identical_to_the_sync_one(tmp_path, tied, max_shard_size):
    model, opt = trained(tied=tied)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": ckpt.capture_rng_state(),
        "trainer": {"global_step": 1, "log_history": [{"loss": 0.5}]},
    }
    ckpt.write_checkpoint(tmp_path / "sync", "checkpoint-1", _write_fn(model, state, max_shard_size))
    writer = AsyncCheckpointWriter()
    _async_save(writer, str(tmp_path / "async"), "checkpoint-1", model, state, max_shard_size=max_shard_size)
    with torch.no_grad():  # training goes on while it is written
        for p in model.parameters():
            p.add_(1)
    writer.wait()
    sync, done = (
        folder_files(tmp_path / "sync" / "checkpoint-1"),
        folder_files(tmp_path / "async" / "checkpoint-1"),
    )
    assert ckpt.CHECKPOINT_COMPLETE_NAME in done and ckpt.OPTIMIZER_NAME in done
    assert (ckpt.WEIGHTS_INDEX_NAME in done) == (max_shard_size == 100)
    assert sorted(sync) == sorted(done)
    assert {k for k in sync if sync[k] != done[k]} == set()


class _Weights:
    """A folder part that can be staged: the model's weights file."""

    def __init__(self, model):
        self.model = model

    def save(self, folder):
        ckpt.save_model_weights(self.model, folder)

    def load(self, folder):
        ckpt.load_model_weights(self.model, folder)

    def stage(self):
        return self.model.state_dict()

    def save_staged(self, folder, staged, group):
        ckpt.save_model_weights(self.model, folder, state_dict=staged)


class _Counters:
    def __init__(self):
        self.state = {"global_step": 3, "history": [{"loss": 1.5}]}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = state


def test_save_checkpoint_async_writes_what_the_manager_writes(tmp_path):
    from trainwright.checkpoint.async_writer import save_checkpoint_async
    from trainwright.checkpoint.manager import CheckpointManager
    from trainwright.checkpoint.rng import RngState

    model, opt = trained()
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    parts = {
        "model": _Weights(model),
        "optimizer": opt,
        "scheduler": sched,
        "rng": RngState(),
        "trainer_state": _Counters(),
    }

    class One:  # what the manager needs of the runtime, for one process
        rank, world_size = 0, 1

        def barrier(self):
            pass

    manager = CheckpointManager(One(), main=True)
    torch.manual_seed(5)
    for i in (1, 2, 3):  # three older checkpoints, rotated to 2 by each save
        manager.save(str(tmp_path / "sync"), f"checkpoint-{i}", parts, save_total_limit=2)
    writer, done = AsyncCheckpointWriter(), []
    torch.manual_seed(5)  # the same RNG state at the save
    out = str(tmp_path / "async")
    for i in (1, 2, 3):
        assert save_checkpoint_async(
            writer, manager, out, f"checkpoint-{i}", parts, save_total_limit=2, on_done=done.append
        )
        kept = model[0].weight.detach().clone()
        with torch.no_grad():  # training goes on (undone before the next save, so it saves the same)
            model[0].weight.add_(1)
        writer.wait()
        with torch.no_grad():
            model[0].weight.copy_(kept)
    assert done == [os.path.join(out, f"checkpoint-{i}") for i in (1, 2, 3)]
    assert (
        sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "sync")) == ["checkpoint-2", "checkpoint-3"]
    )
    for name in ("checkpoint-2", "checkpoint-3"):
        sync, done_files = folder_files(tmp_path / "sync" / name), folder_files(os.path.join(out, name))
        assert sorted(sync) == sorted(done_files) and ckpt.OPTIMIZER_NAME in sync
        assert [f for f in sync if sync[f] != done_files[f]] == []

    class Unstaged:  # a folder part with no stage(): the caller saves synchronously
        def save(self, folder):
            pass

        def load(self, folder):
            pass

    assert not save_checkpoint_async(writer, manager, out, "checkpoint-4", {**parts, "deepspeed": Unstaged()})
    assert not writer.pending and not os.path.exists(os.path.join(out, "checkpoint-4"))


def test_on_done_runs_in_the_polling_thread_once_durable(tmp_path):
    model, opt = trained()
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": {},
        "trainer": {"global_step": 1},
    }
    seen = []
    writer = AsyncCheckpointWriter()
    _async_save(
        writer,
        str(tmp_path),
        "checkpoint-1",
        model,
        state,
        on_done=lambda path: seen.append((threading.get_ident(), path, ckpt.verify_checkpoint(path))),
    )
    deadline = time.monotonic() + 30
    while not writer.poll():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert seen == [(threading.get_ident(), str(tmp_path / "checkpoint-1"), [])]
    assert not writer.pending and writer.writes == 1 and writer.last_duration_s > 0
    assert not writer.poll()


def test_a_background_write_error_is_raised_in_the_training_thread_naming_the_file(tmp_path):
    writer = AsyncCheckpointWriter()
    out = str(tmp_path)

    def bad(tmp):  # a real write error: the folder of the file does not exist
        ckpt.write_json(os.path.join(tmp, "missing", "trainer_state.json"), {})

    writer.submit(os.path.join(out, "checkpoint-1"), lambda: ckpt.write_checkpoint(out, "checkpoint-1", bad))
    with pytest.raises(AsyncCheckpointError) as caught:
        writer.wait()
    text = str(caught.value)
    assert "checkpoint-1" in text and "trainer_state.json" in text and out in text
    assert "background" in text
    assert isinstance(caught.value, ckpt.CheckpointError) and caught.value.__cause__ is not None
    assert os.listdir(out) == []  # no checkpoint, no hidden folder
    writer.wait()  # raised once; the writer goes on
    # a non-write error (a value torch.load(weights_only=True) would refuse) names the file too
    job = lambda: ckpt.write_checkpoint(  # noqa: E731
        out, "checkpoint-2", lambda tmp: ckpt.save_torch_state({"f": len}, os.path.join(tmp, "scheduler.pt"))
    )
    writer.submit(os.path.join(out, "checkpoint-2"), job)
    time.sleep(0.05)
    with pytest.raises(AsyncCheckpointError, match=r"scheduler\.pt"):
        writer.submit(os.path.join(out, "checkpoint-3"), lambda: None)  # the next save surfaces it
    assert not writer.pending
    # drain() hands the error back instead of raising it (a loop already failing with another error)
    writer.submit("checkpoint-4", lambda: 1 / 0)
    error = writer.drain()
    assert isinstance(error, AsyncCheckpointError) and "checkpoint-4" in str(error)
    assert isinstance(error.__cause__, ZeroDivisionError)


def test_at_most_one_write_in_flight():
    writer = AsyncCheckpointWriter()
    release_first = threading.Event()
    events: list[str] = []

    def first():
        events.append("first started")
        release_first.wait(30)
        events.append("first done")

    writer.submit("checkpoint-1", first)
    second_submitted = threading.Event()

    def submit_second():
        writer.submit("checkpoint-2", lambda: events.append("second started"))
        second_submitted.set()

    submitter = threading.Thread(target=submit_second)
    submitter.start()
    time.sleep(0.2)
    assert not second_submitted.is_set() and events == ["first started"]
    release_first.set()
    submitter.join(30)
    assert second_submitted.is_set()
    writer.wait()
    assert events == ["first started", "first done", "second started"]

"""Asynchronous checkpoints: snapshots (isolation, buffer reuse, sharing), the background writer
(one write in flight, errors surfaced in the training thread, completion work in the training
thread), byte-identical files, SIGKILL during background writes, and the commit across 2 processes."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from kit import TESTS
from kit.torchrun import launch_env, torchrun, torchrun_command
from test_checkpoint_faults import _ZYGOTE_PREAMBLE

import trainwright.checkpoint as ckpt
from trainwright.checkpoint.async_writer import AsyncCheckpointError, AsyncCheckpointWriter
from trainwright.checkpoint.snapshot import SnapshotBuffers, SnapshotError


def _trained(width: int = 16, tied: bool = False) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    if tied:
        model: torch.nn.Module = torch.nn.Sequential(torch.nn.Embedding(width, 8), torch.nn.Linear(8, width))
        model[1].weight = model[0].weight
        x = torch.arange(4)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 1))
        x = torch.randn(4, width)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    return model, opt


def _torch_bytes(obj) -> bytes:
    f = io.BytesIO()
    torch.save(obj, f)
    return f.getvalue()


# ------------------------------------------------------------------------------------ snapshots
def test_snapshot_is_isolated_from_later_in_place_updates():
    model, opt = _trained()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "meta": {"step": 1, "tags": ["a"]}}
    expected = _torch_bytes(state)
    snap = SnapshotBuffers().take(state)
    # training goes on: another optimizer step, in-place updates, mutated plain data
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-3)
    state["meta"]["tags"].append("b")
    state["meta"]["step"] = 2
    snap.wait()
    assert _torch_bytes(snap.state) == expected
    assert snap.state["meta"] == {"step": 1, "tags": ["a"]}
    assert _torch_bytes(state) != expected


def test_snapshot_buffers_are_reused_and_bounded():
    model, opt = _trained()
    buffers = SnapshotBuffers()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    first = buffers.take(state)
    ptrs = sorted(t.untyped_storage().data_ptr() for t in first.state["model"].values())
    allocated = buffers.allocations
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.state_dict().values()
    }
    for s in opt.state_dict()["state"].values():
        storages.update({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in s.values()})
    assert first.nbytes == buffers.nbytes == sum(storages.values())
    with pytest.raises(RuntimeError, match="not been released"):
        buffers.take(state)  # its write still reads the buffers
    first.release()
    with torch.no_grad():
        model[0].weight.add_(1)
    second = buffers.take({"model": model.state_dict(), "optimizer": opt.state_dict()})
    assert buffers.allocations == allocated  # nothing allocated in the steady state
    assert sorted(t.untyped_storage().data_ptr() for t in second.state["model"].values()) == ptrs
    assert torch.equal(second.state["model"]["0.weight"], model[0].weight)
    second.release()
    # a changed shape reallocates that buffer only; entries that are gone free theirs
    third = buffers.take({"model": {"0.weight": torch.zeros(3, 3), "0.bias": model[0].bias.detach()}})
    assert buffers.allocations == allocated + 1
    assert buffers.nbytes == third.nbytes == 9 * 4 + 16 * 4
    third.release()


def test_snapshot_keeps_tied_and_shared_tensors_shared():
    model, opt = _trained(tied=True)
    fused = torch.randn(6, 4)
    same = torch.randn(3)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "slices": {"q": fused[:2], "k": fused[2:4], "whole": fused},
        "twice": [same, same],
    }
    snap = SnapshotBuffers().take(state)
    m = snap.state["model"]
    assert m["0.weight"].untyped_storage().data_ptr() == m["1.weight"].untyped_storage().data_ptr()
    s = snap.state["slices"]
    assert s["q"].untyped_storage().data_ptr() == s["whole"].untyped_storage().data_ptr()
    assert s["k"].storage_offset() == 8 and torch.equal(s["k"], fused[2:4])
    assert snap.state["twice"][0] is snap.state["twice"][1]
    assert snap.nbytes == sum(
        t.untyped_storage().nbytes() for t in (model[0].weight, model[1].bias, fused, same)
    ) + sum(t.untyped_storage().nbytes() for st in opt.state_dict()["state"].values() for t in st.values())
    assert _torch_bytes(snap.state) == _torch_bytes(state)


def test_snapshot_names_what_it_cannot_copy():
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(SnapshotError, match=r"state\['opt'\]\['m'\]"):
        SnapshotBuffers().take({"opt": {"m": sparse}})


# ------------------------------------------------------------------------------------ the writer
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


def _files(folder) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            full = os.path.join(root, n)
            out[os.path.relpath(full, folder)] = open(full, "rb").read()
    return out


@pytest.mark.parametrize("max_shard_size", ["5GB", 100])  # one file; shards and an index
@pytest.mark.parametrize("tied", [False, True])
def test_async_checkpoint_is_byte_identical_to_the_sync_one(tmp_path, tied, max_shard_size):
    model, opt = _trained(tied=tied)
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
    sync, done = _files(tmp_path / "sync" / "checkpoint-1"), _files(tmp_path / "async" / "checkpoint-1")
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

    model, opt = _trained()
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
        sync, done_files = _files(tmp_path / "sync" / name), _files(os.path.join(out, name))
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
    model, opt = _trained()
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


# ------------------------------------------------------------------------------------ SIGKILL
# The zygote of test_checkpoint_faults.py, saving through the async writer: the worker snapshots,
# goes on mutating the live weights while the writer thread writes (every filesystem operation of
# the write gated by the parent), and reports a save as done only when its on_done ran.
_ASYNC_ZYGOTE = _ZYGOTE_PREAMBLE + textwrap.dedent(
    """
    from trainwright.checkpoint.async_writer import AsyncCheckpointWriter

    writer = AsyncCheckpointWriter()

    def save(out, step, version):
        writer.wait()
        send(f"saving {step} {version}")
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(step * 10 + version)
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": ckpt.capture_rng_state()}

        def write_files(copy):
            def write(tmp):
                gate("write model")
                ckpt.save_model_weights(model, tmp, state_dict=copy["model"])
                gate("write optimizer")
                ckpt.save_torch_state(copy["optimizer"], os.path.join(tmp, ckpt.OPTIMIZER_NAME))
                gate("write rng")
                ckpt.save_torch_state(copy["rng"], ckpt.rng_state_file(tmp))
                gate("write trainer_state")
                ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), {"global_step": step, "version": version})

            return ckpt.write_checkpoint(out, f"checkpoint-{step}", write)

        def done(path):
            ckpt.rotate_checkpoints(out, save_total_limit=2)  # in the training thread
            send(f"saved {step} {version}")

        writer.save(os.path.join(out, f"checkpoint-{step}"), state, write_files, done)
        # training goes on while the checkpoint is written: the live weights move away from it
        while writer.pending:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.5)
            writer.poll()

    def work(out):
        global gating
        save(out, 1, 1)
        save(out, 2, 1)
        for name in ("mkdir", "rename", "replace", "fsync", "unlink", "rmdir"):
            setattr(os, name, gated(name))
        real_open = builtins.open

        def gated_open(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                gate("open " + os.path.basename(str(file)))
            return real_open(file, mode, *args, **kwargs)

        builtins.open = gated_open
        gating = True
        save(out, 3, 1)
        save(out, 3, 2)
        save(out, 4, 1)
        writer.wait()
        send("done")

    send("ready")
    while True:
        command = recv()
        if not command.startswith("run "):
            continue
        pid = os.fork()
        if pid == 0:
            try:
                send(f"pid {os.getpid()}")
                work(command[4:])
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        send(f"exit {status}")
    """
)


def test_sigkill_during_background_writes_leaves_the_previous_checkpoint(tmp_path):
    import test_checkpoint_faults as faults

    class AsyncZygote(faults._Zygote):
        def __init__(self, tmp_path, width: int) -> None:
            script = tmp_path / "async_zygote.py"
            script.write_text(_ASYNC_ZYGOTE)
            self.proc = subprocess.Popen(
                [sys.executable, str(script), str(width)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
            )
            assert self._line() == "ready"

    width = 384
    zygote = AsyncZygote(tmp_path, width)
    try:
        full = zygote.run(tmp_path / "calibrate")
        assert full["saved"] == (4, 1) and not full["killed"]
        ops = full["ops"]
        commits = [i for i, op in enumerate(ops) if op.startswith(("rename", "unlink", "rmdir"))]
        points = sorted({round(i * (len(ops) - 1) / 15) for i in range(16)} | set(commits[::2]))
        writes = [i for i, op in enumerate(ops) if op == "write model"]
        trials = [(p, 0.0) for p in points] + [(writes[i % len(writes)], 0.002 * (i + 1)) for i in range(4)]
        for n, (point, delay) in enumerate(trials):
            out = tmp_path / f"trial-{n}"
            result = zygote.run(out, kill_at=point, delay=delay)
            assert result["killed"], (point, delay)
            faults._check_after_crash(out, result, width)
        assert len(trials) >= 20
    finally:
        zygote.close()


# ------------------------------------------------------------------------------------ 2 processes
_DIST_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    import trainwright.checkpoint as ckpt
    from trainwright.checkpoint.async_writer import AsyncCheckpointError, AsyncCheckpointWriter, GroupCollectives
    from trainwright.checkpoint.snapshot import SnapshotBuffers

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = sys.argv[1]
    comms = GroupCollectives(timeout_s=120)
    writer = AsyncCheckpointWriter()
    model = torch.nn.Linear(32, 32)
    result = {"errors": [], "collectives": 0}

    def save(step):
        with torch.no_grad():
            model.weight.fill_(step)
        state = {"model": model.state_dict(), "rng": ckpt.capture_rng_state()}

        def write_files(copy):
            def write(tmp):
                if rank == 0:
                    ckpt.save_model_weights(model, tmp, state_dict=copy["model"])
                if rank == 1:
                    time.sleep(1.0)  # the slow rank: rank 0 must not commit before its files are in
                    if step == 3:  # a real write error on rank 1 only
                        ckpt.write_json(os.path.join(tmp, "missing", "rank1.json"), {})
                ckpt.save_torch_state(copy["rng"], ckpt.rng_state_file(tmp, rank, world))

            return ckpt.write_checkpoint(out, f"checkpoint-{step}", write, runtime=comms)

        writer.save(os.path.join(out, f"checkpoint-{step}"), state, write_files)

    for step in (1, 2, 3):
        try:
            save(step)
        except AsyncCheckpointError as exc:
            result["errors"].append(str(exc))
        # training collectives on the default group while the writer thread uses its own group
        for _ in range(20):
            t = torch.ones(256) * (rank + 1)
            dist.all_reduce(t)
            assert float(t[0]) == 3.0
            result["collectives"] += 1
    try:
        writer.wait()
    except AsyncCheckpointError as exc:
        result["errors"].append(str(exc))
    with open(os.path.join(out, f"result_{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    """
)


def _torchrun(script, *args, timeout: float = 240) -> None:
    cmd = [*torchrun_command(), str(script), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=launch_env(), timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_two_process_async_commit_waits_for_every_rank(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_DIST_JOB)
    out = tmp_path / "out"
    out.mkdir()
    _torchrun(script, out)
    results = [json.loads((out / f"result_{r}.json").read_text()) for r in range(2)]
    for step in (1, 2):
        folder = out / f"checkpoint-{step}"
        assert ckpt.verify_checkpoint(folder) == []
        manifest = json.loads((folder / ckpt.CHECKPOINT_COMPLETE_NAME).read_text())
        assert {"model.safetensors", "rng_state_0.pth", "rng_state_1.pth"} <= set(manifest["files"])
        weights = torch.nn.Linear(32, 32)
        ckpt.load_model_weights(weights, folder)
        assert bool((weights.weight == step).all())
    # rank 1's error fails the commit on both ranks, named with the rank and the file
    assert not (out / "checkpoint-3").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    for r in results:
        assert r["collectives"] == 60
        assert len(r["errors"]) == 1, r
        assert (
            "rank 1" in r["errors"][0] and "rank1.json" in r["errors"][0] and "checkpoint-3" in r["errors"][0]
        )


_FSDP_JOB = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    import trainwright.checkpoint as ckpt
    from trainwright.checkpoint.async_writer import AsyncCheckpointWriter, GroupCollectives

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = sys.argv[1]
    comms = GroupCollectives(timeout_s=120)
    writer = AsyncCheckpointWriter()

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    model, opt = build()
    g = torch.Generator().manual_seed(rank)

    def train_step():
        model(torch.randn(8, 16, generator=g)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    def write_dcp(tmp, state, group=None):
        dcp.save({"model": state["model"]}, checkpoint_id=os.path.join(tmp, "pytorch_model_fsdp_0"), process_group=group)
        dcp.save({"optimizer": state["optimizer"]}, checkpoint_id=os.path.join(tmp, "optimizer_0"), process_group=group)

    train_step()
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt)}
    ckpt.write_checkpoint(os.path.join(out, "sync"), "checkpoint-1", lambda tmp: write_dcp(tmp, state), runtime=comms)
    expected = [p.full_tensor().clone() for p in model.parameters()]
    write = lambda copy: ckpt.write_checkpoint(  # noqa: E731
        os.path.join(out, "async"), "checkpoint-1", lambda tmp: write_dcp(tmp, copy, comms.group), runtime=comms
    )
    writer.save(os.path.join(out, "async", "checkpoint-1"), state, write)
    snapshot_bytes = writer.snapshot_bytes
    for _ in range(3):  # training goes on (FSDP's all-gathers on the default group) while it is written
        train_step()
    writer.wait()
    moved = [p.full_tensor() for p in model.parameters()]

    fresh, fresh_opt = build()
    loaded = {"model": get_model_state_dict(fresh)}
    dcp.load(loaded, checkpoint_id=os.path.join(out, "async", "checkpoint-1", "pytorch_model_fsdp_0"))
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
    set_model_state_dict(fresh, loaded["model"])
    got = [p.full_tensor() for p in fresh.parameters()]
    result = {
        "equal": all(torch.equal(a, b) for a, b in zip(got, expected)),
        "moved": any(not torch.equal(a, b) for a, b in zip(moved, expected)),
        "snapshot_bytes": snapshot_bytes,
    }
    with open(os.path.join(out, f"fsdp_{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    """
)


def test_fsdp2_async_dcp_checkpoint_matches_the_sync_one(tmp_path):
    script = tmp_path / "fsdp_job.py"
    script.write_text(_FSDP_JOB)
    out = tmp_path / "out"
    out.mkdir()
    _torchrun(script, out)
    for r in range(2):
        result = json.loads((out / f"fsdp_{r}.json").read_text())
        assert result["equal"] and result["moved"] and result["snapshot_bytes"] > 0, result
    sync, done = out / "sync" / "checkpoint-1", out / "async" / "checkpoint-1"
    assert ckpt.verify_checkpoint(done) == []
    sync_files, async_files = _files(sync), _files(done)
    assert sorted(sync_files) == sorted(async_files)
    # the shards' bytes are the same; DCP's .metadata carries a random save id, and the manifest its checksum
    differ = {k for k in sync_files if sync_files[k] != async_files[k]}
    assert {os.path.basename(k) for k in differ} <= {".metadata", ckpt.CHECKPOINT_COMPLETE_NAME}, differ
    assert any(k.endswith(".distcp") for k in sync_files)


# ------------------------------------------------------------------------------------ the Trainer
class TokenRows(torch.utils.data.Dataset):
    def __init__(self, n: int = 48, seq: int = 12, vocab: int = 64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(out, model=None, data=None, callbacks=(), **kw):
    from conftest import DropoutMLP, VectorDataset

    from trainwright import Trainer, TrainingArguments

    kw = {
        "max_steps": 6,
        "save_strategy": "steps",
        "save_steps": 2,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "learning_rate": 0.05,
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 3,
        **kw,
    }
    torch.manual_seed(0)
    return Trainer(
        model=model if model is not None else DropoutMLP(),
        args=TrainingArguments(output_dir=str(out), **kw),
        train_dataset=data if data is not None else VectorDataset(),
        callbacks=list(callbacks),
    )


def _checkpoints(out) -> dict[str, dict[str, bytes]]:
    return {p: _files(os.path.join(out, p)) for p in sorted(os.listdir(out)) if p.startswith("checkpoint-")}


@pytest.mark.parametrize("model", ["mlp", "gpt2"])
def test_trainer_async_checkpoints_are_byte_identical_to_sync_ones(tmp_path, model):
    from conftest import tiny_gpt2

    runs = {}
    out = tmp_path / "run"  # the same output_dir for both (training_args.json records it)
    for mode in ("sync", "async"):
        if model == "gpt2":  # transformers' save_pretrained, tied embeddings, dropout
            trainer = _trainer(
                out, tiny_gpt2(dropout=0.1), TokenRows(), async_save=mode == "async", save_total_limit=2
            )
        else:
            trainer = _trainer(out, async_save=mode == "async", save_total_limit=2)
        trainer.train()
        runs[mode] = _checkpoints(out)
        assert [e for e in os.listdir(out) if e.startswith(".") and "lock" not in e] == []
        os.rename(out, tmp_path / mode)
    assert list(runs["sync"]) == list(runs["async"]) == ["checkpoint-4", "checkpoint-6"]  # rotated alike
    for name, files in runs["sync"].items():
        assert ckpt.CHECKPOINT_COMPLETE_NAME in files
        assert sorted(files) == sorted(runs["async"][name]), name
        assert [f for f in files if files[f] != runs["async"][name][f]] == [], name


class _SlowWrites:
    """Makes the background write of the optimizer state sleep first, and records which threads
    wrote Stateful parts and how many such writes ran at once."""

    def __init__(self, monkeypatch, delay: float = 0.15) -> None:
        from trainwright.checkpoint.manager import CheckpointManager

        real = CheckpointManager.write_state
        self.threads: set[str] = set()
        self.running = self.most = 0
        lock = threading.Lock()

        def slow(manager, folder, name, state):
            with lock:
                self.running += 1
                self.most = max(self.most, self.running)
            self.threads.add(threading.current_thread().name)
            try:
                if name == "optimizer":
                    time.sleep(delay)
                return real(manager, folder, name, state)
            finally:
                with lock:
                    self.running -= 1

        monkeypatch.setattr(CheckpointManager, "write_state", slow)


def test_on_save_fires_once_per_checkpoint_when_it_is_durable(tmp_path, monkeypatch):
    from trainwright import TrainerCallback

    slow = _SlowWrites(monkeypatch)
    seen: list[tuple[int, int, bool]] = []
    steps_while_writing: list[int] = []

    class Watch(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_step_end(self, args, state, control, **kw):
            writer = self.trainer._run.checkpointer.writer
            if writer is not None and writer.pending:
                steps_while_writing.append(state.global_step)

        def on_save(self, args, state, control, **kw):
            # the state of the saved step; the folder is complete when the event fires
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            seen.append(
                (state.global_step, self.trainer.state.global_step, ckpt.verify_checkpoint(folder) == [])
            )

    watch = Watch()
    trainer = _trainer(tmp_path, callbacks=[watch], async_save=True, max_steps=8, save_total_limit=1)
    watch.trainer = trainer
    trainer.train()
    assert [s[0] for s in seen] == [2, 4, 6, 8] and all(s[2] for s in seen)
    assert all(live >= saved for saved, live, _ in seen)
    assert steps_while_writing  # training went on while a checkpoint was written
    assert slow.most == 1 and slow.threads == {"trainwright-checkpoint-writer"}
    assert not trainer._run.checkpointer.writer.pending  # train() returned with the last one durable
    assert sorted(e for e in os.listdir(tmp_path) if not e.startswith(".")) == ["checkpoint-8"]  # rotated


def test_save_model_and_load_best_model_wait_for_the_pending_checkpoint(tmp_path, monkeypatch):
    from conftest import VectorDataset
    from safetensors.torch import load_file

    from trainwright import TrainerCallback

    _SlowWrites(monkeypatch, delay=0.3)
    observed = []

    class SaveModelAfterASave(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:  # checkpoint-2 is being written
                pending = self.trainer._run.checkpointer.writer.pending
                self.trainer.save_model(os.path.join(args.output_dir, "exported"))
                observed.append(
                    (pending, ckpt.verify_checkpoint(os.path.join(args.output_dir, "checkpoint-2")))
                )

    cb = SaveModelAfterASave()
    trainer = _trainer(
        tmp_path,
        callbacks=[cb],
        async_save=True,
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
    )
    trainer.eval_dataset = VectorDataset(16, seed=1)
    cb.trainer = trainer
    trainer.train()
    assert observed == [(True, [])]
    best = trainer.state.best_model_checkpoint
    assert best is not None and ckpt.verify_checkpoint(best) == []
    weights = trainer.model.state_dict()
    saved = load_file(os.path.join(best, ckpt.WEIGHTS_NAME))
    assert all(torch.equal(weights[k], saved[k]) for k in saved)


def test_a_background_write_error_stops_training_naming_the_file(tmp_path):
    from trainwright import TrainerCallback
    from trainwright.core.state import ExportableState

    class Unwritable(TrainerCallback, ExportableState):
        """Its exported state is not JSON: trainer_state.json can't be written (in the background)."""

        def state(self):
            return {"args": {}, "attributes": {"when": object()}}

    trainer = _trainer(tmp_path, callbacks=[Unwritable()], async_save=True)
    with pytest.raises(AsyncCheckpointError) as caught:
        trainer.train()
    text = str(caught.value)
    assert "trainer_state.json" in text and "checkpoint-2" in text and "background" in text
    assert trainer.state.global_step in (
        2,
        3,
        4,
    )  # raised at a step boundary after the write, or the next save
    assert [e for e in os.listdir(tmp_path) if e.startswith("checkpoint-") or ".tmp-" in e] == []


def test_an_exception_in_the_loop_finishes_the_pending_write(tmp_path, monkeypatch):
    from trainwright import TrainerCallback

    _SlowWrites(monkeypatch, delay=0.3)

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:  # checkpoint-2 is being written
                raise ValueError("boom at step 3")

    trainer = _trainer(tmp_path, callbacks=[Boom()], async_save=True)
    with pytest.raises(ValueError, match="boom at step 3"):
        trainer.train()
    assert ckpt.verify_checkpoint(tmp_path / "checkpoint-2") == []
    assert ckpt.get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    assert [e for e in os.listdir(tmp_path) if ".tmp-" in e] == []
    assert not trainer._run.checkpointer.writer.pending
    trainer.remove_callback(Boom)
    trainer.train(resume_from_checkpoint=True)  # the lock was released, the checkpoint resumes
    assert trainer.state.global_step == 6


def test_preemption_with_a_pending_write_exits_with_the_checkpoints_durable(tmp_path, monkeypatch):
    import signal

    from trainwright import TrainerCallback

    _SlowWrites(monkeypatch, delay=0.3)

    class Preempt(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:  # checkpoint-2 is still being written
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = _trainer(tmp_path, callbacks=[Preempt()], async_save=True, max_steps=8)
    with pytest.raises(SystemExit) as exit_info:
        trainer.train()
    assert exit_info.value.code == 0
    for step in (2, 3):
        assert ckpt.verify_checkpoint(tmp_path / f"checkpoint-{step}") == []
    assert ckpt.get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")


def test_a_subclass_overriding_a_save_hook_saves_synchronously(tmp_path, caplog):
    from conftest import DropoutMLP, VectorDataset

    from trainwright import Trainer, TrainingArguments

    calls = []

    class Custom(Trainer):
        def _save(self, output_dir=None, state_dict=None):
            calls.append(threading.current_thread().name)
            super()._save(output_dir, state_dict)

    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        save_steps=2,
        async_save=True,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        per_device_train_batch_size=4,
    )
    trainer = Custom(model=DropoutMLP(), args=args, train_dataset=VectorDataset())
    with caplog.at_level("WARNING", logger="trainwright"):
        trainer.train()
    assert calls == [threading.current_thread().name] * 2
    said = [r.getMessage() for r in caplog.records if "written synchronously" in r.getMessage()]
    assert len(said) == 1 and "overrides _save" in said[0]  # once, naming the hook
    assert trainer._run.checkpointer.writer is None


_RESUME_JOB = textwrap.dedent(
    """
    import json, os, sys
    import torch
    sys.path.insert(0, sys.argv[2])
    from conftest import DropoutMLP, VectorDataset
    from trainwright import Trainer, TrainingArguments

    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=cfg["out"], max_steps=12, save_strategy="steps", save_steps=2, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=0.05, lr_scheduler_type="cosine", warmup_steps=2,
        logging_steps=1, report_to="none", disable_tqdm=True, use_cpu=True, seed=3, async_save=cfg["async"],
    )
    torch.manual_seed(0)
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset())
    out = trainer.train(resume_from_checkpoint=cfg.get("resume"))
    trainer.save_model(os.path.join(cfg["out"], "final"))
    rows = [r for r in trainer.state.log_history if "loss" in r]
    with open(os.path.join(cfg["out"], "result.json"), "w") as f:
        json.dump({"rows": rows, "train_loss": out.training_loss, "step": out.global_step}, f)
    """
)


def test_resume_from_an_async_checkpoint_in_a_new_process_is_bit_exact(tmp_path):
    import shutil

    from safetensors.torch import load_file

    script = tmp_path / "job.py"
    script.write_text(_RESUME_JOB)

    def job(**cfg):
        proc = subprocess.run(
            [sys.executable, str(script), json.dumps(cfg), str(TESTS)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        out = cfg["out"]
        return json.loads(open(os.path.join(out, "result.json")).read()), load_file(
            os.path.join(out, "final", ckpt.WEIGHTS_NAME)
        )

    ref, ref_weights = job(out=str(tmp_path / "sync"), **{"async": False})
    done, done_weights = job(out=str(tmp_path / "async"), **{"async": True})
    assert done == ref and all(torch.equal(done_weights[k], ref_weights[k]) for k in ref_weights)
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "async" / "checkpoint-6", resumed_dir / "checkpoint-6")
    res, weights = job(out=str(resumed_dir), resume=True, **{"async": True})
    assert res["step"] == 12 and res["rows"] == ref["rows"] and res["train_loss"] == ref["train_loss"]
    assert all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights)


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_process_trainer_async_checkpoints_equal_sync_ones(tmp_path, engine):
    """2 real processes (torchrun, gloo): every rank's files in the checkpoint, committed when both
    are done, the same bytes as a synchronous run's (FSDP: DCP's .metadata records a random save id
    and the hidden folder's name, which differ between any two saves; the rest of it is equal)."""
    from kit.torchrun import FSDP_WRAP, LM_GA

    task = {"name": "job", "args": {"save_strategy": "steps", "save_steps": 1, "save_total_limit": 3}}
    if engine == "fsdp":
        task.update(model="lm", args={**task["args"], **LM_GA, **FSDP_WRAP})
    runs, results = {}, {}
    out = tmp_path / "run"
    for mode in ("sync", "async"):
        job = {**task, "args": {**task["args"], "async_save": mode == "async"}}
        torchrun({"out": str(out), "tasks": [job]})
        folder = out / "job"
        runs[mode] = _checkpoints(folder)
        results[mode] = json.loads((folder / "result.json").read_text())
        assert [e for e in os.listdir(folder) if ".tmp-" in e] == []
        os.rename(out, tmp_path / mode)
    assert results["async"]["rows"] == results["sync"]["rows"]
    assert list(runs["async"]) == list(runs["sync"]) == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]
    for name, files in runs["sync"].items():
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(files)
        assert ckpt.verify_checkpoint(tmp_path / "async" / "job" / name) == []
        assert sorted(files) == sorted(runs["async"][name])
        differ = {f for f in files if files[f] != runs["async"][name][f]}
        allowed = {".metadata", ckpt.CHECKPOINT_COMPLETE_NAME} if engine == "fsdp" else set()
        assert {os.path.basename(f) for f in differ} <= allowed, (name, differ)
        for f in (f for f in differ if f.endswith(".metadata")):  # DCP's own pickle, read as DCP reads it
            sync_meta, async_meta = (pickle.loads(run[name][f]) for run in (runs["sync"], runs["async"]))
            # what differs is storage_meta: a random save_id and the hidden folder's random name
            assert sync_meta.state_dict_metadata == async_meta.state_dict_metadata, f
            assert (
                sync_meta.storage_data == async_meta.storage_data
                and sync_meta.planner_data == async_meta.planner_data
            )


def test_a_full_disk_during_a_background_write_keeps_the_previous_checkpoint(tmp_path):
    """A real full disk (tmpfs) under the writer thread: the error reaches train() naming the
    checkpoint, the file and the full disk; the previous checkpoint stays the newest."""
    from kit.faults import Net, check_full_disk_error, fault_trainer, mounted_tmpfs

    # as in test_faults_runtime: a checkpoint ~1 MiB on a 1.56 MiB disk, the second fails in optimizer.pt
    with mounted_tmpfs(tmp_path / "disk", "1600k") as out:
        trainer = fault_trainer(out, model=Net(width=8000), max_steps=4, save_steps=2, async_save=True)
        with pytest.raises(AsyncCheckpointError) as info:
            trainer.train()
        check_full_disk_error(info.value, out, "checkpoint-4", "optimizer.pt")
        assert "background" in str(info.value)
        assert sorted(os.listdir(out)) == ["checkpoint-2"]  # no hidden folder, no lock left
        assert ckpt.get_last_checkpoint(out) == os.path.join(out, "checkpoint-2")


def test_wait_for_checkpoint_returns_once_the_background_write_is_durable(tmp_path, make_args, monkeypatch):
    """`Trainer.wait_for_checkpoint()`: the public way to wait for an async save (benches, a user
    copying a checkpoint): on return the folder is in place and `on_save` has run."""
    from conftest import DropoutMLP, VectorDataset

    from trainwright import Trainer, TrainerCallback
    from trainwright.checkpoint import async_writer

    slow_write = async_writer.write_checkpoint

    def slow(*args, **kwargs):  # the background write outlasts the next step
        time.sleep(0.5)
        return slow_write(*args, **kwargs)

    monkeypatch.setattr(async_writer, "write_checkpoint", slow)

    class WaitAfterSave(TrainerCallback):
        def __init__(self):
            self.saved: list[int] = []
            self.seen: list[tuple[int, bool, list[int]]] = []
            self.trainer = None

        def on_save(self, args, state, control, **kwargs):
            self.saved.append(state.global_step)

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step and state.global_step % 2 == 0:  # the step after a save
                self.trainer.wait_for_checkpoint()
                folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
                done = os.path.isfile(os.path.join(folder, "checkpoint_complete.json"))
                self.seen.append((state.global_step, done, list(self.saved)))

    callback = WaitAfterSave()
    args = make_args(
        output_dir=str(tmp_path),
        max_steps=5,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=2,
        async_save=True,
    )
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(16), callbacks=[callback])
    callback.trainer = trainer
    trainer.train()
    assert callback.seen == [(2, True, [2]), (4, True, [2, 4])]  # durable, and on_save ran by then
    idle = Trainer(model=DropoutMLP(), args=make_args(output_dir=str(tmp_path / "idle")))
    idle.wait_for_checkpoint()  # nothing written: returns at once

"""write_checkpoint's atomic commit: a marker listing the files, everything fsynced before the rename,
a folder of the same name replaced, leftovers of a crash ignored then cleaned, write errors (a full
disk, no permission) keeping the earlier checkpoints, and the commit across 2 processes."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
from checkpoint_kit import fake_checkpoint, hidden_entries, mlp, write_files
from kit.torchrun import free_port

import trainwright.checkpoint as ckpt
from trainwright.checkpoint import weights as checkpoint_weights


def test_write_checkpoint_commits_with_marker(tmp_path):
    out = tmp_path / "out"
    path = ckpt.write_checkpoint(
        out, "checkpoint-7", write_files({"a.bin": b"12345", "trainer_state.json": b'{"global_step": 7}'})
    )
    assert path == os.path.join(out, "checkpoint-7")
    assert sorted(os.listdir(path)) == ["a.bin", "checkpoint_complete.json", "trainer_state.json"]
    marker = json.loads(pathlib.Path(path, "checkpoint_complete.json").read_text())
    assert marker["files"] == {"a.bin": 5, "trainer_state.json": 18}
    assert ckpt.verify_checkpoint(path) == [] and hidden_entries(out) == []
    assert ckpt.get_last_checkpoint(out) == path


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name fsynced descriptors")
def test_everything_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_rename = os.fsync, os.rename
    monkeypatch.setattr(
        os,
        "fsync",
        lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1],
    )
    monkeypatch.setattr(
        os, "rename", lambda a, b: (events.append(("rename", os.fspath(a))), real_rename(a, b))[1]
    )

    def write(tmp):
        ckpt.save_model_weights(mlp(), tmp)
        ckpt.save_torch_state({"step": torch.tensor(3)}, os.path.join(tmp, ckpt.OPTIMIZER_NAME))
        ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), {})
        ckpt.save_rng_state(tmp)
        os.makedirs(os.path.join(tmp, "sub"))
        pathlib.Path(tmp, "sub", "user.txt").write_text("written without our helpers")

    path = ckpt.write_checkpoint(tmp_path, "checkpoint-1", write)
    (commit,) = [i for i, e in enumerate(events) if e[0] == "rename" and ".checkpoint-1.tmp-" in e[1]]
    tmp = events[commit][1]
    synced_before = [e[1] for e in events[:commit] if e[0] == "fsync"]
    files = [os.path.relpath(os.path.join(r, n), path) for r, _, ns in os.walk(path) for n in ns]
    assert len(files) == 6
    for rel in files:  # each file once: the helpers leave flushing to the commit
        assert synced_before.count(os.path.join(tmp, rel)) == 1, rel
    assert tmp in synced_before and os.path.join(tmp, "sub") in synced_before
    assert ("fsync", str(tmp_path)) in events[commit + 1 :]

    events.clear()
    ckpt.save_torch_state({"step": 1}, tmp_path / "alone.pt")  # outside a checkpoint: flushed at once
    assert events == [("fsync", str(tmp_path / "alone.pt"))]


def test_write_checkpoint_replaces_same_name(tmp_path):
    ckpt.write_checkpoint(tmp_path, "checkpoint-1", write_files({"a.bin": b"old", "stale.bin": b"1"}))
    path = ckpt.write_checkpoint(tmp_path, "checkpoint-1", write_files({"a.bin": b"newer"}))
    assert pathlib.Path(path, "a.bin").read_bytes() == b"newer"
    assert not pathlib.Path(path, "stale.bin").exists()
    assert hidden_entries(tmp_path) == [] and ckpt.verify_checkpoint(path) == []


def test_leftovers_are_ignored_then_cleaned(tmp_path):
    good = fake_checkpoint(tmp_path, 2)
    for name in (".checkpoint-3.tmp-1a-0b", ".checkpoint-1.trash-2-ff"):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "model.safetensors").write_bytes(b"x")
        (tmp_path / name / "trainer_state.json").write_bytes(b'{"global_step": 0}')
    (tmp_path / ".git").mkdir()  # not ours: left alone
    assert ckpt.get_last_checkpoint(tmp_path) == good
    fake_checkpoint(tmp_path, 4)
    assert hidden_entries(tmp_path) == [".git"]


def test_interrupted_replacement_is_found_and_restored(tmp_path):
    # A crash between "old copy steps aside" and "new copy moves in" leaves only the hidden old copy.
    path = fake_checkpoint(tmp_path, 2, b"step2")
    fake_checkpoint(tmp_path, 1)
    hidden = tmp_path / ".checkpoint-2.old-1f-abcd0123"
    os.rename(path, hidden)
    assert ckpt.get_last_checkpoint(tmp_path) == str(hidden)
    assert ckpt.clean_checkpoint_leftovers(tmp_path) == []
    assert ckpt.get_last_checkpoint(tmp_path) == path and hidden_entries(tmp_path) == []
    assert pathlib.Path(path, "model.safetensors").read_bytes() == b"step2"


def _enospc_save_file(tensors, filename, metadata=None):
    with open(filename, "wb") as f:
        f.write(b"partial")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)


def test_full_disk_raises_and_keeps_earlier_checkpoints(tmp_path, monkeypatch):
    earlier = fake_checkpoint(tmp_path, 1, b"safe")
    monkeypatch.setattr(checkpoint_weights, "save_file", _enospc_save_file)
    with pytest.raises(
        ckpt.CheckpointError, match=f"checkpoint 'checkpoint-2' in {tmp_path}: No space left on device"
    ) as info:
        ckpt.write_checkpoint(tmp_path, "checkpoint-2", lambda tmp: ckpt.save_model_weights(mlp(), tmp))
    assert isinstance(info.value.__cause__, OSError)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1"]
    assert ckpt.verify_checkpoint(earlier) == [] and ckpt.get_last_checkpoint(tmp_path) == earlier


def test_unwritable_output_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(
        ckpt.CheckpointError, match=f"could not write checkpoint 'checkpoint-1' in {blocker}/out"
    ):
        ckpt.write_checkpoint(blocker / "out", "checkpoint-1", write_files({}))

    earlier = fake_checkpoint(tmp_path / "run", 1)

    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(ckpt.CheckpointError, match="Permission denied"):
        ckpt.write_checkpoint(tmp_path / "run", "checkpoint-2", write_files({}))
    assert os.listdir(tmp_path / "run") == ["checkpoint-1"] and ckpt.verify_checkpoint(earlier) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_output_dir(tmp_path):
    earlier = fake_checkpoint(tmp_path, 1)
    os.chmod(tmp_path, 0o555)
    try:
        with pytest.raises(ckpt.CheckpointError, match=f"in {tmp_path}: Permission denied"):
            ckpt.write_checkpoint(tmp_path, "checkpoint-2", write_files({}))
    finally:
        os.chmod(tmp_path, 0o755)
    assert os.listdir(tmp_path) == ["checkpoint-1"] and ckpt.verify_checkpoint(earlier) == []


def test_other_errors_propagate_and_clean_up(tmp_path):
    def broken(tmp):
        pathlib.Path(tmp, "half.bin").write_bytes(b"1")
        raise KeyError("no such optimizer state")

    with pytest.raises(KeyError, match="no such optimizer state"):
        ckpt.write_checkpoint(tmp_path, "checkpoint-1", broken)
    assert os.listdir(tmp_path) == []


def test_write_checkpoint_rejects_bad_names_and_missing_runtime(tmp_path, monkeypatch):
    for bad in ("", ".checkpoint-1", "a/b", ".."):
        with pytest.raises(ValueError, match="plain folder name"):
            ckpt.write_checkpoint(tmp_path, bad, write_files({}))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="pass runtime="):
        ckpt.write_checkpoint(tmp_path, "checkpoint-1", write_files({}))
    assert os.listdir(tmp_path) == []


_TWO_RANKS = textwrap.dedent(
    """
    import errno, os, sys
    import trainwright.checkpoint as ckpt
    from trainwright.core.runtime import get_runtime

    out = sys.argv[1]
    rt = get_runtime(use_cpu=True)

    def write(tmp):
        if rt.is_main_process:
            ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), {"global_step": 1})
        ckpt.save_rng_state(tmp, rt.rank, rt.world_size)

    print("saved", ckpt.write_checkpoint(out, "checkpoint-1", write, runtime=rt), flush=True)

    def fail_on_rank1(tmp):
        ckpt.save_rng_state(tmp, rt.rank, rt.world_size)
        if rt.rank == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    try:
        ckpt.write_checkpoint(out, "checkpoint-2", fail_on_rank1, runtime=rt)
    except ckpt.CheckpointError as exc:
        print("error", exc, flush=True)
    rt.shutdown()
    """
)


def test_write_checkpoint_with_two_processes(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(_TWO_RANKS)
    out = tmp_path / "out"
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    final = out / "checkpoint-1"
    for text in outputs:
        assert f"saved {final}" in text
        assert (
            "error rank 1: could not write checkpoint 'checkpoint-2'" in text
            and "No space left on device" in text
        )
    marker = json.loads((final / "checkpoint_complete.json").read_text())
    assert set(marker["files"]) == {"trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"}
    assert ckpt.verify_checkpoint(final) == []
    assert os.listdir(out) == ["checkpoint-1"]

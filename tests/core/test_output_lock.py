"""The one-writer lock on `output_dir` (issue 18, items 3-5), with real files, links, folders and
processes: it cannot be aimed at another file, it is released only by its holder, and a killed run
leaves the folder as transformers leaves it.

The lock is a flock on the folder's own descriptor (its record in an extended attribute); where a
folder cannot be flocked (NFS) it is a `filelock.FileLock` on a file beside the folder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat

import pytest
from kit.faults import fault_trainer

import trainwright.checkpoint as ckpt
from trainwright.core import output_lock
from trainwright.core.output_lock import (
    RECORD_ATTR,
    OutputDirError,
    OutputDirInUseError,
    OutputDirLock,
)

SLOW = {"max_steps": 10_000, "step_sleep": 0.05}


def _beside(out: str) -> str:
    parent, name = os.path.split(os.path.realpath(out))
    return os.path.join(parent, f".{name}.trainwright.lock")


@pytest.fixture
def no_folder_flock(monkeypatch):
    """flock on a directory fails with EBADF, as on NFS (flock emulated by byte-range locks)."""
    real = fcntl.flock

    def flock(fd, op):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real(fd, op)

    monkeypatch.setattr(output_lock.fcntl, "flock", flock)


def _refused(out: str, match: str, error=OutputDirError) -> None:
    with pytest.raises(error, match=match):
        fault_trainer(out).train()


# ------------------------------------------------------------------ 3: nothing followed or replaced


def test_a_link_in_the_lock_files_place_is_refused_and_its_target_untouched(tmp_path, no_folder_flock):
    out = str(tmp_path / "out")
    os.makedirs(out)
    link = _beside(out)  # the NFS fallback's lock file
    precious = tmp_path / "precious.txt"  # any file the user (as root: any file at all) can write
    precious.write_text("keep me")
    os.symlink(precious, link)
    _refused(out, f"{link} is a symbolic link \\(to {str(precious)!r}\\), not a lock file trainwright wrote")
    assert precious.read_text() == "keep me"

    os.unlink(link)
    outside = tmp_path / "elsewhere" / "created"
    os.makedirs(outside.parent)
    os.symlink(outside, link)  # dangling: following it would create a file outside output_dir
    _refused(out, f"{link} is a symbolic link")
    assert not outside.exists()
    assert os.listdir(out) == []


def test_a_folder_or_a_pipe_in_the_lock_files_place_is_refused_naming_it(tmp_path, no_folder_flock):
    out = tmp_path / "out"
    out.mkdir()
    lock = _beside(str(out))
    os.mkdir(lock)
    _refused(str(out), f"{lock} is a folder, not a lock file trainwright wrote.*Remove it")
    os.rmdir(lock)
    os.mkfifo(lock)  # a pipe could be flocked: it is no lock file
    _refused(str(out), f"{lock} is not a regular file")
    os.unlink(lock)
    fault_trainer(str(out)).train()  # removed: the run goes ahead
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4"]


# ------------------------------------------------------------------- 4: released only by its holder


def test_a_run_ending_never_releases_the_lock_of_the_run_that_replaced_its_folder(tmp_path, jobs):
    """The first run's folder is moved away by hand and a second run starts in a new one: the first
    stops at its next save naming the folder (it writes nothing into the second's), and when it ends
    the second's lock stays and a third run is refused."""
    out = str(tmp_path / "out")
    first = jobs({"output_dir": out, "max_steps": 30, "step_sleep": 0.1})
    first.wait_for("STARTED")
    os.rename(out, out + ".moved")
    second = jobs({"output_dir": out, **SLOW})
    pid = int(second.wait_for("STARTED").split()[1])
    code, _, stderr = first.finish()
    assert code != 0 and "is not the folder this run locked when train() started" in stderr, stderr[-3000:]
    assert json.loads(os.getxattr(out, RECORD_ATTR))["pid"] == pid  # the second's record is intact
    code, stdout, stderr = jobs({"output_dir": out, "max_steps": 2}).finish()
    assert code != 0 and "STARTED" not in stdout
    assert f"is in use by another training run (pid {pid} on host" in stderr
    second.proc.send_signal(signal.SIGTERM)
    assert second.finish()[0] == 0


def test_with_the_lock_file_beside_a_deleted_file_is_never_unlinked_by_the_first_holder(tmp_path, jobs):
    """Where folders cannot be flocked (NFS) the lock is a file beside output_dir. Deleted by hand while
    held, a second run takes a new one; the first run's end leaves the second's file and record alone,
    so a third run is still refused."""
    out = str(tmp_path / "out")
    first = jobs({"output_dir": out, "max_steps": 30, "step_sleep": 0.1, "no_folder_flock": True})
    first_pid = int(first.wait_for("STARTED").split()[1])
    lock = _beside(out)
    assert json.loads(open(lock).read())["pid"] == first_pid
    os.unlink(lock)
    second = jobs({"output_dir": out, **SLOW, "no_folder_flock": True})
    pid = int(second.wait_for("STARTED").split()[1])
    code, _, stderr = first.finish()
    assert code == 0, stderr[-3000:]
    assert json.loads(open(lock).read())["pid"] == pid
    code, stdout, stderr = jobs({"output_dir": out, "max_steps": 2, "no_folder_flock": True}).finish()
    assert code != 0 and "STARTED" not in stdout
    assert f"is in use by another training run (pid {pid} on host" in stderr and f"locked: {lock}" in stderr
    second.proc.send_signal(signal.SIGTERM)
    assert second.finish()[0] == 0
    assert open(lock).read() == ""  # released by its holder: its record cleared (filelock keeps the file)


def test_lock_file_beside_the_folder_in_one_process(tmp_path, no_folder_flock):
    out = str(tmp_path / "out")
    os.makedirs(out)
    with OutputDirLock(out) as held:
        assert held.path == _beside(out) and held.locked
        assert json.loads(open(held.path).read())["pid"] == os.getpid()
        with pytest.raises(OutputDirInUseError, match=f"pid {os.getpid()} on host"):
            OutputDirLock(out).acquire()
        assert os.listdir(out) == []
    assert open(_beside(out)).read() == ""  # released: no record left to name a holder
    with OutputDirLock(out) as again:  # and it can be taken again
        assert again.locked


@pytest.mark.parametrize("folder_flock", [True, False], ids=["folder", "beside"])
def test_a_forked_worker_holds_no_copy_of_the_lock(tmp_path, request, folder_flock):
    # a dataloader worker that outlives a killed trainer must not keep the output_dir locked (the
    # folder's descriptor: closed by output_lock's at-fork hook; the file beside it: by filelock's)
    if not folder_flock:
        request.getfixturevalue("no_folder_flock")
    out = str(tmp_path / "out")
    os.makedirs(out)
    with OutputDirLock(out) as held:
        fd = held._fd if folder_flock else held._file_fd
        assert fd is not None
        pid = os.fork()
        if pid == 0:  # the worker: its copy of the lock's descriptor is closed
            try:
                os.fstat(fd)
            except OSError:
                os._exit(0)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_the_record_names_the_holder_and_goes_with_the_lock(tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(out)
    with OutputDirLock(out):
        record = json.loads(os.getxattr(out, RECORD_ATTR))
        assert record["pid"] == os.getpid() and record["host"] and record["started"]
        os.removexattr(out, RECORD_ATTR)  # no record (a filesystem without user attributes)
        with pytest.raises(OutputDirInUseError, match=f"pid {os.getpid()} on host") as info:
            OutputDirLock(out).acquire()  # the holder is found in /proc/locks
        assert info.value.holder["pid"] == os.getpid()
    assert RECORD_ATTR not in os.listxattr(out) and os.listdir(out) == []


# -------------------------------------------------- 5: a killed run leaves the folder as transformers


def _example_script_refuses(output_dir: str) -> bool:
    """transformers' example scripts (run_clm.py, ...): no checkpoint to resume and a non-empty
    output_dir means "Output directory ... already exists and is not empty"."""
    return ckpt.get_last_checkpoint(output_dir) is None and len(os.listdir(output_dir)) > 0


@pytest.mark.parametrize("folder_flock", [True, False], ids=["folder", "beside"])
def test_a_run_killed_before_its_first_checkpoint_leaves_an_empty_folder(tmp_path, jobs, folder_flock):
    out = str(tmp_path / "out")
    extra = {} if folder_flock else {"no_folder_flock": True}
    first = jobs({"output_dir": out, **SLOW, "workers": 2, **extra})
    first.wait_for("STEP 3")
    os.kill(first.proc.pid, signal.SIGKILL)
    assert first.proc.wait(timeout=60) == -signal.SIGKILL
    assert os.listdir(out) == [] and not _example_script_refuses(out)
    code, stdout, stderr = jobs({"output_dir": out, "max_steps": 2, "save_steps": 1, **extra}).finish()
    assert code == 0, stderr[-3000:]
    assert sorted(os.listdir(out)) == ["checkpoint-1", "checkpoint-2"]

"""One writer per `output_dir`, checked before any compute: writability and an advisory lock.

`Trainer.train()` (and `TFTrainer.train()`) calls `claim_output_dir(args, runtime)` before the training loop
starts. On every process that writes files (`args.should_save`: the main process, or each node's local
main process with `save_on_each_node`) it

1. checks that `output_dir` can be written: it must not be empty or a file, the folder is created,
   and a probe file is written, fsynced and removed. A failure raises `OutputDirError` naming the field
   `output_dir`, the path and the cause, before `save_steps` of compute are spent;
2. takes an advisory lock: `fcntl.flock(LOCK_EX | LOCK_NB)` on the folder's own descriptor. Nothing
   is written into the folder, so a run killed before its first checkpoint (SIGKILL, out of memory)
   leaves it as transformers leaves it: empty, which example scripts such as `run_clm.py` require
   before they start again. The holder's pid, host and start time are kept in the folder's extended
   attribute `user.trainwright.lock` (set and removed through the held descriptor, so a folder
   renamed or replaced meanwhile is never touched); a second writer gets `OutputDirInUseError` naming
   `output_dir` and the holder. The kernel drops the lock when the holder dies.

Where a directory cannot be flocked (NFS emulates flock with byte-range locks, which need a file open
for writing), the lock is a `filelock.FileLock` on a file beside the folder,
`<parent>/.<name>.trainwright.lock`, taken without waiting (`timeout=0`); the holder's record is its
content (written when the lock is taken, cleared on release). filelock opens it without following
links; anything but a regular file in its place is refused naming the path. The file stays after
release, as filelock leaves it (unlinking a locked file would split contenders across inodes). Where
neither can be locked (no `fcntl`, a filesystem without locks, a parent folder that cannot be written)
a warning says so once and training goes on unlocked.

Forked children (dataloader workers) close their copy of the held descriptor (the folder's here, the
file's by filelock's own at-fork hook), so a worker outliving a killed trainer does not hold the lock. With several processes the outcome is shared, so every rank
raises the same error. Two writers that share a filesystem and both pass `save_on_each_node=True`
(several nodes, one shared output_dir) take the same lock: the second node's run is refused, as their
checkpoints would collide.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import secrets
import socket
import stat
import time
import warnings
from collections.abc import Callable
from typing import Any

import filelock

try:  # not on Windows
    import fcntl
except ImportError:  # pragma: no cover - exercised on Windows only
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

RECORD_ATTR = "user.trainwright.lock"
_PROBE_PREFIX = ".trainwright-write-probe-"
# flock errors meaning "this filesystem can't lock this", not "someone holds it"; EBADF: NFS and a
# descriptor not open for writing (a directory)
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS, errno.EBADF}
_HELD = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_warned_unsupported: set[str] = set()
# Descriptors of the locks this process holds. A flock belongs to the open file, which a forked child
# (a dataloader worker) shares: its copy is closed in every child, so a worker that outlives a killed
# trainer does not keep the lock.
_held_fds: set[int] = set()
# The folders this process holds locked (absolute path -> the device and inode they had then): a save
# first checks that `output_dir` is still that folder (`moved_since_locked`).
_locked_folders: dict[str, tuple[int, int]] = {}


def _close_in_child() -> None:
    for fd in list(_held_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class OutputDirError(RuntimeError):
    """`output_dir` cannot be used for this run; the message names the path, the cause and the fix."""


class OutputDirInUseError(OutputDirError):
    """Another process holds the lock on `output_dir` (its pid/host are in the message and `holder`)."""

    def __init__(self, message: str, holder: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.holder = holder


def create_output_dir(output_dir: Any) -> str:
    """Create `output_dir` (what the Trainer's constructor does, as upstream's); returns the path.

    Raises `OutputDirError` naming the field `output_dir`, the path and the cause when it is empty,
    a file, or cannot be created.
    """
    path = os.fspath(output_dir) if output_dir is not None else ""
    if not path:
        raise OutputDirError(
            "output_dir is empty (''): checkpoints need a folder. Give a path, e.g. output_dir='trainer_output'."
        )
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputDirError(
            f"output_dir={path!r} is a file, not a folder: checkpoints could not be written there. "
            "Choose another output_dir or move the file away."
        )
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(_cannot_write(path, exc, "cannot be created")) from exc
    return path


def check_output_dir_writable(output_dir: Any) -> str:
    """Create `output_dir` and write, fsync and remove a probe file in it; returns the path.

    Raises `OutputDirError` naming the field `output_dir`, the path and the cause.
    """
    path = create_output_dir(output_dir)
    probe = os.path.join(path, f"{_PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    fd = None
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"trainwright write probe\n")
        os.fsync(fd)
        os.close(fd)
        fd = None
        os.unlink(probe)
    except OSError as exc:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
        raise OutputDirError(_cannot_write(path, exc, "is not writable")) from exc
    return path


def _cannot_write(path: str, exc: OSError, what: str) -> str:
    cause = exc.strerror or f"{type(exc).__name__}: {exc}"
    where = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != path else ""
    hint = {
        errno.EACCES: "give this user write permission on it",
        errno.EPERM: "give this user write permission on it",
        errno.EROFS: "it is on a read-only filesystem",
        errno.ENOSPC: "its disk is full",
        errno.ENOTDIR: "a part of the path is a file",
    }.get(exc.errno or 0, "")
    return (
        f"output_dir={path!r} {what}: {cause}{where}. Checkpoints are written there; "
        + (f"{hint}, or " if hint else "")
        + "choose another output_dir."
    )


def _flock(fd: int) -> bool:
    """True when this process now holds `fd`'s exclusive flock, False when another one does."""
    assert fcntl is not None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _HELD:
            return False
        raise
    return True


def _not_a_lock_file(path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
        kind = (
            f"a symbolic link (to {os.readlink(path)!r})"
            if stat.S_ISLNK(mode)
            else "a folder"
            if stat.S_ISDIR(mode)
            else "not a regular file"
        )
    except OSError:
        kind = "not a regular file"
    return (
        f"{path} is {kind}, not a lock file trainwright wrote: it is neither followed nor changed. "
        "Remove it, then start the run again."
    )


def _record() -> bytes:
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
    ).encode()


def _record_in_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    try:
        return os.pread(fd, 4096, 0)
    finally:
        os.close(fd)


def _record_in_attribute(fd: int) -> bytes:
    return os.getxattr(fd, RECORD_ATTR)


def _parse(data: bytes | str) -> dict[str, Any] | None:
    try:
        holder = json.loads(data)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _alive_here(holder: dict[str, Any]) -> bool:
    """False for a record of this host whose process is gone (left by a killed run)."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder.get("pid", -1)), 0)
    except (OSError, ValueError, OverflowError) as exc:
        return isinstance(exc, PermissionError)
    return True


def _flock_holder_here(st: os.stat_result) -> dict[str, Any] | None:
    """The local process holding a flock on the inode `st` (Linux's /proc/locks), if any."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError), open("/proc/locks", encoding="ascii") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == key:
                return {"pid": int(fields[4]), "host": socket.gethostname()}
    return None


class OutputDirLock:
    """An exclusive advisory lock on `output_dir` (see the module's docstring), `acquire()` to `release()`."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = os.fspath(output_dir)
        self.path = self.output_dir  # what is locked: the folder, or the lock file beside it
        self._fd: int | None = None
        self._file_lock: filelock.FileLock | None = None
        self._file_fd: int | None = None  # the file lock's descriptor, lent by filelock while held
        self.locked = False

    def acquire(self) -> OutputDirLock:
        if fcntl is None:
            return self._unsupported("this platform has no fcntl.flock")
        try:
            fd = os.open(
                self.output_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
            )
        except OSError as exc:
            raise OutputDirError(_cannot_write(self.output_dir, exc, "cannot be opened")) from exc
        try:
            held = _flock(fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _UNSUPPORTED:
                raise OutputDirError(
                    f"output_dir={self.output_dir!r}: could not lock it: {exc.strerror}"
                ) from exc
            if not self._acquire_file_beside(exc):
                return self
        else:
            if not held:
                self._refuse(fd)
            self._fd, self.locked = fd, True
            _held_fds.add(fd)
            with contextlib.suppress(OSError, AttributeError):  # a record where the filesystem keeps one
                os.setxattr(fd, RECORD_ATTR, _record())
        st = os.stat(self.output_dir)
        _locked_folders[os.path.abspath(self.output_dir)] = (st.st_dev, st.st_ino)
        return self

    def _acquire_file_beside(self, why: OSError) -> bool:
        """Lock `<parent>/.<name>.trainwright.lock` with filelock (a folder cannot be flocked here);
        False when that cannot be locked either (warned)."""
        parent, name = os.path.split(os.path.realpath(self.output_dir))
        if not name:
            self._unsupported(f"flock on a folder failed: {why.strerror}")
            return False
        self.path = os.path.join(parent, f".{name}.trainwright.lock")
        with contextlib.suppress(FileNotFoundError):  # a link is refused by filelock too (O_NOFOLLOW)
            if not stat.S_ISREG(os.lstat(self.path).st_mode):  # a pipe would be locked, a folder fails
                raise OutputDirError(_not_a_lock_file(self.path))
        lock = filelock.FileLock(self.path, timeout=0, fallback_to_soft=False, on_acquired=self._write_record)
        try:
            lock.acquire()
        except filelock.Timeout:
            holder = self._wait_for_record(lambda: _record_in_file(self.path))
            with contextlib.suppress(OSError):
                holder = holder or _flock_holder_here(os.stat(self.path))
            raise OutputDirInUseError(self._in_use_message(holder), holder) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link put there
                raise OutputDirError(_not_a_lock_file(self.path)) from None
            what = "flock failed" if exc.errno in _UNSUPPORTED else f"{self.path} cannot be locked"
            self._unsupported(f"flock on a folder failed, and {what}: {exc.strerror}")
            return False
        self._file_lock, self.locked = lock, True
        return True

    def _write_record(self, fd: int) -> None:
        """filelock's `on_acquired`: the holder's record as the lock file's content."""
        self._file_fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, _record() + b"\n", 0)

    def _refuse(self, fd: int) -> None:
        """Raise OutputDirInUseError naming the holder of the folder's flock (its record, else /proc/locks)."""
        try:
            st = os.fstat(fd)
            holder = self._wait_for_record(lambda: _record_in_attribute(fd)) or _flock_holder_here(st)
        finally:
            os.close(fd)
        raise OutputDirInUseError(self._in_use_message(holder), holder)

    @staticmethod
    def _wait_for_record(read: Callable[[], bytes]) -> dict[str, Any] | None:
        # The holder writes its record right after taking the lock; a reader may be a moment early,
        # and may meanwhile see the record a killed holder left.
        holder = None
        for _ in range(50):
            with contextlib.suppress(OSError, AttributeError):
                holder = _parse(read())
                if holder is not None and _alive_here(holder):
                    return holder
            time.sleep(0.01)
        return None

    def _in_use_message(self, holder: dict[str, Any] | None) -> str:
        who = (
            f"pid {holder.get('pid')} on host {holder.get('host')}"
            + (f", started {holder['started']}" if holder.get("started") else "")
            if holder
            else "a process that did not record itself"
        )
        return (
            f"output_dir={self.output_dir!r} is in use by another training run ({who}; locked: "
            f"{self.path}). Two runs writing one output_dir overwrite and rotate away each other's "
            "checkpoints. Wait for that run to finish or stop it, or choose another output_dir."
        )

    def _unsupported(self, why: str) -> OutputDirLock:
        key = os.path.abspath(self.output_dir)
        if key not in _warned_unsupported:
            _warned_unsupported.add(key)
            warnings.warn(
                f"output_dir={self.output_dir!r} cannot be locked ({why}; some network filesystems "
                "do not support it): a second run writing the same output_dir will not be detected.",
                stacklevel=3,
            )
        return self

    def release(self) -> None:
        """Drop the lock; only what this process locked is changed (its record)."""
        fd, self._fd = self._fd, None
        lock, self._file_lock = self._file_lock, None
        file_fd, self._file_fd = self._file_fd, None
        if fd is None and lock is None:
            return
        _locked_folders.pop(os.path.abspath(self.output_dir), None)
        self.locked = False
        if lock is not None:
            with contextlib.suppress(OSError):  # no record left behind for the next contender to read
                if file_fd is not None:
                    os.ftruncate(file_fd, 0)
            lock.release()
            return
        assert fd is not None
        _held_fds.discard(fd)
        try:
            with contextlib.suppress(OSError):
                os.removexattr(fd, RECORD_ATTR)
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> OutputDirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def moved_since_locked(folder: str) -> str | None:
    """Why `folder`, locked by this process, is no longer the folder it locked (removed, renamed
    away, replaced by another folder or a link elsewhere), or None: still it, or not locked here."""
    identity = _locked_folders.get(os.path.abspath(folder))
    if identity is None:
        return None
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        now = "it no longer exists (removed or renamed)"
    else:
        if (st.st_dev, st.st_ino) == identity:
            return None
        now = "another folder (or a link to one) is in its place"
    return (
        f"output_dir={folder!r} is not the folder this run locked when train() started: {now}. Nothing was "
        "written or deleted there: another run could be using it unlocked. Restore the folder, or resume "
        "from a checkpoint into a new output_dir."
    )


def claim_output_dir(args: Any, runtime: Any = None, folder: str | None = None) -> OutputDirLock | None:
    """Check `output_dir` is writable and lock it on the writing process(es); every rank raises the
    same `OutputDirError` when one of them fails. Returns the lock to release (None on other ranks).
    `folder`: the folder the run writes when it is not `output_dir` (a search trial's run folder:
    trials running at once in other processes share `output_dir`). Read: the arguments'
    `output_dir` and `should_save`, and with several processes the runtime's `world_size` and
    `all_gather_object` (None: one process)."""
    folder = args.output_dir if folder is None else folder
    lock, failure = None, None
    if args.should_save:
        try:
            check_output_dir_writable(folder)
            lock = OutputDirLock(folder).acquire()
        except OutputDirError as exc:
            failure = exc
    errors = [str(failure)] if failure is not None else []
    if runtime is not None and runtime.world_size > 1:
        errors = [
            f"rank {r}: {e}"
            for r, e in enumerate(runtime.all_gather_object(errors[0] if errors else None))
            if e
        ]
    if errors and lock is not None:
        lock.release()
    if failure is not None:
        raise failure
    if errors:
        raise OutputDirError("; ".join(errors))
    return lock

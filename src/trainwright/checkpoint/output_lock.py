"""One writer per `output_dir`, checked before any compute: writability and an advisory lock.

`Trainer.train()` calls `claim_output_dir(trainer)` before the training loop starts. On every process
that writes files (`args.should_save`: the main process, or each node's local main process with
`save_on_each_node`) it

1. checks that `output_dir` can be written: it must not be empty or a file, the folder is created,
   and a probe file is written, fsynced and removed. A failure raises `OutputDirError` naming the field
   `output_dir`, the path and the cause, before `save_steps` of compute are spent;
2. takes an advisory lock, `fcntl.flock(LOCK_EX | LOCK_NB)` on `output_dir/.trainwright.lock`, whose
   content is the holder's pid, host and start time (JSON). A second writer gets
   `OutputDirInUseError` naming `output_dir` and the holder. The lock is released when `train()`
   returns or raises (the file is removed), and by the kernel when the process dies (a SIGKILLed run
   leaves the file, not the lock: the next run takes it). Where the filesystem does not support
   `flock` (some network filesystems, or no `fcntl` module) a warning says so once and training goes
   on unlocked. Forked children (dataloader workers) close their copy of the lock's descriptor, so
   a worker outliving a killed trainer does not hold the lock.

With several processes the outcome is shared, so every rank raises the same error.
Two writers that share a filesystem and both pass `save_on_each_node=True` (several nodes, one shared
output_dir) take the same lock: the second node's run is refused, as their checkpoints would collide.
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
import time
import warnings
from typing import Any

try:  # not on Windows
    import fcntl
except ImportError:  # pragma: no cover - exercised on Windows only
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

LOCK_NAME = ".trainwright.lock"
_PROBE_PREFIX = ".trainwright-write-probe-"
# flock errors meaning "this filesystem can't lock", not "someone holds it"
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}
_warned_unsupported: set[str] = set()
# Descriptors of the locks this process holds. A flock belongs to the open file, which a forked child
# (a dataloader worker) shares: its copy is closed in every child, so a worker that outlives a killed
# trainer does not keep the lock.
_held_fds: set[int] = set()


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


class OutputDirLock:
    """`fcntl.flock` on `output_dir/.trainwright.lock`, held from `acquire()` to `release()`."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = os.fspath(output_dir)
        self.path = os.path.join(self.output_dir, LOCK_NAME)
        self._fd: int | None = None
        self.locked = False

    def acquire(self) -> OutputDirLock:
        if fcntl is None:
            self._unsupported("this platform has no fcntl.flock")
            return self
        for _ in range(100):  # the file may be removed by a releasing holder between open and flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    holder = self._read_holder()
                    raise OutputDirInUseError(self._in_use_message(holder), holder) from None
                if exc.errno in _UNSUPPORTED:
                    self._unsupported(f"flock failed: {exc.strerror}")
                    return self
                raise OutputDirError(
                    f"output_dir={self.output_dir!r}: could not lock {self.path}: {exc.strerror}"
                ) from exc
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # locked a file its holder had just removed: try the new one
                os.close(fd)
                continue
            self._fd, self.locked = fd, True
            _held_fds.add(fd)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "output_dir": os.path.abspath(self.output_dir),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
            return self
        raise OutputDirError(
            f"output_dir={self.output_dir!r}: could not lock {self.path} (it keeps changing)"
        )

    def _read_holder(self) -> dict[str, Any] | None:
        # The holder writes its record right after taking the lock; a reader may be a moment early.
        for _ in range(50):
            try:
                with open(self.path, encoding="utf-8") as f:
                    text = f.read()
                holder = json.loads(text)
                if isinstance(holder, dict):
                    return holder
            except (OSError, ValueError):
                pass
            time.sleep(0.01)
        return None

    def _in_use_message(self, holder: dict[str, Any] | None) -> str:
        who = (
            f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}"
            if holder
            else "a process that did not record itself"
        )
        return (
            f"output_dir={self.output_dir!r} is in use by another training run ({who}; lock file "
            f"{self.path}). Two runs writing one output_dir overwrite and rotate away each other's "
            "checkpoints. Wait for that run to finish or stop it, or choose another output_dir."
        )

    def _unsupported(self, why: str) -> None:
        key = os.path.abspath(self.output_dir)
        if key not in _warned_unsupported:
            _warned_unsupported.add(key)
            warnings.warn(
                f"output_dir={self.output_dir!r} cannot be locked ({why}; some network filesystems "
                "do not support it): a second run writing the same output_dir will not be detected.",
                stacklevel=3,
            )

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _held_fds.discard(fd)
        try:
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # while still locked: a waiter re-checks the inode
        finally:
            os.close(fd)  # closing the descriptor releases the flock
            self.locked = False

    def __enter__(self) -> OutputDirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def claim_output_dir(trainer: Any, folder: str | None = None) -> OutputDirLock | None:
    """Check `output_dir` is writable and lock it on the writing process(es); every rank raises the
    same `OutputDirError` when one of them fails. Returns the lock to release (None on other ranks).
    `folder`: the folder the run writes when it is not `output_dir` (a search trial's run folder:
    trials running at once in other processes share `output_dir`)."""
    args, runtime = trainer.args, trainer.runtime
    folder = args.output_dir if folder is None else folder
    lock, failure = None, None
    if args.should_save:
        try:
            check_output_dir_writable(folder)
            lock = OutputDirLock(folder).acquire()
        except OutputDirError as exc:
            failure = exc
    errors = [str(failure)] if failure is not None else []
    if runtime.world_size > 1:
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

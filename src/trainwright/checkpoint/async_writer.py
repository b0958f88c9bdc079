"""Checkpoint writes on a background thread, one at a time, finished in the training thread.

`AsyncCheckpointWriter` runs a job on a thread while training goes on:

* `save(target, state, write, on_done=...)` finishes the previous write, snapshots `state` into the
  writer's reused host buffers (`snapshot.SnapshotBuffers`) and runs `write(copy_of_state)` (e.g. a
  `write_checkpoint` of the copy) in the background; the training thread pays for the wait (only
  when the previous write is still running) and the memory copy;
* `submit(target, job, on_done=...)` is the same for a job that needs no snapshot. At most one write
  is in flight, so host memory holds one snapshot;
* `poll()` is called by the loop at step boundaries: when the write has finished it runs `on_done`
  in the calling (training) thread, so rotation, best-checkpoint bookkeeping and `on_save`
  callbacks (which are not thread-safe) see a durable checkpoint; it returns at once otherwise;
* `wait()` blocks until the write is done and finishes it the same way;
* a job's error is raised by the next `poll` / `wait` / `submit` in the training thread, as an
  `AsyncCheckpointError` (a `CheckpointError`) naming the checkpoint folder (and the file, when the
  writer named it), with the original as `__cause__`; `drain()` returns it instead, for a loop that
  is already failing with another error; `drain(cancel=True)`, for a user's abort (Ctrl-C), stops
  the write at its next file without committing it, as Ctrl-C stops a synchronous save.

Why a thread and not a process: the snapshot is already a private host copy, and the write is
dominated by file I/O, fsync and hashing, which release the GIL; the bench (`bench/checkpoint.py`)
measures the training steps/s while a write runs.

Several processes (DDP, shared filesystem): the write is `write_checkpoint` run on every rank's
writer thread with `GroupCollectives` in place of the runtime: a gloo process group created for the
writer (collectively, when training starts). Every rank writes its own files into the hidden
temporary folder, rank 0 commits (manifest, fsync, rename) once every rank reports its files
written, and every rank learns the outcome, as in a synchronous save. A separate group is used
because collectives of the default group from this thread would interleave with the training
thread's collectives (a hang or a mismatch); marker files in the temporary folder were the other
choice, but polling a shared filesystem's listings is slow and unreliable (NFS caches directory
attributes), a dead rank would be found only by a home-made timeout, and the other ranks would still
need a channel to learn rank 0's commit outcome.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from trainwright.checkpoint.files import CheckpointError
from trainwright.checkpoint.folder import rotate_checkpoints, write_checkpoint
from trainwright.checkpoint.manager import CheckpointManager
from trainwright.checkpoint.snapshot import SnapshotBuffers

__all__ = [
    "AsyncCheckpointError",
    "AsyncCheckpointWriter",
    "GroupCollectives",
    "StagedPart",
    "WriteCancelled",
    "save_checkpoint_async",
]

logger = logging.getLogger(__name__)


class AsyncCheckpointError(CheckpointError):
    """A checkpoint written in the background failed; the message names the folder (and file)."""


class WriteCancelled(CheckpointError):
    """A background write stopped by `drain(cancel=True)` before its commit: nothing was committed."""


class GroupCollectives:
    """What `write_checkpoint` needs of a runtime (rank, world_size, object broadcast and gather),
    over a process group of its own, for use from the writer thread.

    Create it on every rank at the same point (it creates a gloo group collectively), before any
    write is submitted. The writer thread is then its only user: every rank submits the same saves in
    the same order, so the group's collectives pair up.
    """

    def __init__(self, timeout_s: float = 1800.0, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        if group is None:
            group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)

    def destroy(self) -> None:
        self._dist.destroy_process_group(self.group)


class _Write:
    """One submitted job and what became of it."""

    def __init__(self, target: str, job: Callable[[], Any], on_done: Callable[[Any], None] | None) -> None:
        self.target, self.job, self.on_done = target, job, on_done
        self.result: Any = None
        self.error: BaseException | None = None
        self.submitted = time.perf_counter()
        self.finished: float | None = None  # when the job returned (the checkpoint is durable)
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.result = self.job()
        except BaseException as exc:  # SystemExit too: it must reach the training thread, not end here
            self.error = exc
        finally:
            self.finished = time.perf_counter()
            self.done.set()


class AsyncCheckpointWriter:
    """Runs one checkpoint write at a time on a background thread (see the module docstring)."""

    def __init__(
        self, name: str = "trainwright-checkpoint-writer", *, pin_memory: bool | None = None
    ) -> None:
        self.name = name
        self.buffers = SnapshotBuffers(pin_memory=pin_memory)
        self._pending: _Write | None = None
        self.last_duration_s: float | None = None  # submit -> durable, of the last finished write
        self.last_blocked_s: float | None = None  # what the last `save` cost the calling thread
        self.writes = 0  # writes finished successfully
        self._cancel = threading.Event()  # set by drain(cancel=True); the job checks it between files

    @property
    def snapshot_bytes(self) -> int:
        """Host bytes held for snapshots (one checkpoint's worth at most)."""
        return self.buffers.nbytes

    def save(
        self,
        target: str,
        state: Any,
        write: Callable[[Any], Any],
        on_done: Callable[[Any], None] | None = None,
    ) -> None:
        """Finish the previous write, snapshot `state` (see `snapshot`), then run `write(copy)` on the
        writer thread; `on_done(result)` as in `submit`."""
        start = time.perf_counter()
        self.wait()  # the previous write may still read the buffers the snapshot reuses
        snapshot = self.buffers.take(state)

        def job() -> Any:
            try:
                snapshot.wait()
                return write(snapshot.state)
            finally:
                snapshot.release()

        self.submit(target, job, on_done)
        self.last_blocked_s = time.perf_counter() - start

    @property
    def pending(self) -> bool:
        """Whether a write was submitted and not yet finished by `poll` / `wait` / `drain`."""
        return self._pending is not None

    @property
    def ready(self) -> bool:
        """Whether the pending write's job has returned (finish it with `poll` / `wait`)."""
        return self._pending is not None and self._pending.done.is_set()

    @property
    def pending_target(self) -> str | None:
        return None if self._pending is None else self._pending.target

    def check_cancelled(self, what: str) -> None:
        """In a job, between files: raise `WriteCancelled` (naming `what`) once the write was cancelled."""
        if self._cancel.is_set():
            raise WriteCancelled(f"{what}: cancelled before its commit")

    def submit(
        self, target: str, job: Callable[[], Any], on_done: Callable[[Any], None] | None = None
    ) -> None:
        """Finish the previous write (raising its error), then run `job()` on the writer thread.

        `target` names what is written (the checkpoint folder) in errors; `on_done(result)` runs in
        the thread that calls `poll`/`wait`/`submit` after `job` succeeded.
        """
        self.wait()
        self._cancel.clear()
        write = _Write(target, job, on_done)
        thread = threading.Thread(target=write.run, name=self.name, daemon=False)
        # Not a daemon: an interpreter that exits while a write runs lets it finish instead of
        # cutting it off (an interrupted write leaves only a hidden folder, never a broken checkpoint).
        self._pending = write
        thread.start()

    def poll(self) -> bool:
        """Finish the pending write if it is done (its `on_done` runs here); True when one finished.
        Never blocks."""
        write = self._pending
        if write is None or not write.done.is_set():
            return False
        self._finish(write)
        return True

    def wait(self) -> None:
        """Block until the pending write is done, then finish it (run `on_done`, or raise its error)."""
        write = self._pending
        if write is None:
            return
        write.done.wait()
        self._finish(write)

    def drain(self, cancel: bool = False) -> BaseException | None:
        """Like `wait`, but return the write's error (as an `AsyncCheckpointError`) instead of raising
        it, and skip `on_done`: for a loop that is unwinding from another error.

        `cancel` (the user aborted: Ctrl-C): the write stops at its next file (with several processes,
        once its files are written) and its hidden folder is removed, as a synchronous save interrupted
        by Ctrl-C; one already committing its files is finished. Either way a warning says which: the
        checkpoint is complete or absent."""
        write = self._pending
        if write is None:
            return None
        if cancel:
            self._cancel.set()
        write.done.wait()
        self._pending = None
        if write.finished is not None:
            self.last_duration_s = write.finished - write.submitted
        if write.error is None:
            self.writes += 1
            if cancel:
                logger.warning(
                    "Aborted: %s was already being committed when the abort came; it is complete and kept.",
                    write.target,
                )
            return None
        if cancel and isinstance(write.error, WriteCancelled):
            logger.warning(
                "Aborted: %s, being written in the background, was discarded (nothing of it is left); "
                "the checkpoints before it are untouched.",
                write.target,
            )
            return None
        return self._error(write)

    def close(self) -> None:
        """`wait()`: nothing is left running."""
        self.wait()

    def _finish(self, write: _Write) -> None:
        self._pending = None  # an error is raised once; the next save starts afresh
        if write.finished is not None:
            self.last_duration_s = write.finished - write.submitted
        if write.error is not None:
            raise self._error(write) from write.error
        self.writes += 1
        if write.on_done is not None:
            write.on_done(write.result)

    @staticmethod
    def _error(write: _Write) -> AsyncCheckpointError:
        exc = write.error
        assert exc is not None
        if isinstance(exc, CheckpointError):  # write_checkpoint's message names the folder and file
            text = str(exc)
            if write.target not in text:
                text = f"{write.target}: {text}"
        else:
            text = f"could not write checkpoint {write.target}: {type(exc).__name__}: {exc}"
        error = AsyncCheckpointError(f"{text} (written in the background)")
        error.__cause__ = exc
        return error


@runtime_checkable
class StagedPart(Protocol):
    """A folder part (see `manager.FolderPart`) that can be written in the background: `stage()`
    returns, in the training thread, what its `save` reads (tensors and plain data, which are then
    snapshotted); `save_staged(folder, staged, group)` writes the same files from it on the writer
    thread, using process group `group` (None: one process) for any collective it needs."""

    def stage(self) -> Any: ...

    def save_staged(self, folder: str, staged: Any, group: Any) -> Any: ...


def save_checkpoint_async(
    writer: AsyncCheckpointWriter,
    manager: CheckpointManager,
    run_dir: str,
    name: str,
    parts: Mapping[str, Any],
    *,
    collectives: GroupCollectives | None = None,
    save_total_limit: int | None = None,
    best_checkpoint: str | None = None,
    keep: Iterable[str] = (),
    exclude: Iterable[str] = (),
    on_done: Callable[[str], None] | None = None,
) -> bool:
    """`manager.save(run_dir, name, parts, ...)` with the writing in the background.

    In the calling thread: finish the previous write, take the Stateful parts' state dicts and the
    folder parts' staged state, copy them (`writer.save`). On the writer thread: the same files as
    `CheckpointManager.save`, written in the same order into `write_checkpoint`'s hidden folder and
    committed when every process is done (`collectives`: a `GroupCollectives` when several
    processes save). `on_done(path)` runs, after the rotation, in the thread that finishes the
    write (`writer.poll` / `wait`). Returns False, having done nothing, when a folder part can't be
    staged (it has no `stage`): then save synchronously.
    """
    manager.learn(parts)
    folder_parts = {n: p for n, p in parts.items() if not manager.is_stateful(n)}
    if not all(isinstance(p, StagedPart) for p in folder_parts.values()):
        return False
    writer.wait()  # the previous write (and its rotation) first; its buffers are reused below
    states = manager.snapshot(parts)
    staged = {n: p.stage() for n, p in folder_parts.items()}
    group = collectives.group if collectives is not None else None

    target = os.path.join(run_dir, name)

    def write(copy: dict[str, Any]) -> str:
        def write_files(tmp: str) -> None:
            for part_name, part in parts.items():  # the order of CheckpointManager.save
                if collectives is None:  # with several processes a part may hold collectives all must join
                    writer.check_cancelled(target)
                if part_name in folder_parts:
                    part.save_staged(tmp, copy["staged"][part_name], group)
                elif part_name in copy["states"]:
                    manager.write_state(tmp, part_name, copy["states"][part_name])
            # every process gets to write_checkpoint's gather from here: a cancel discards it everywhere
            writer.check_cancelled(target)

        return write_checkpoint(run_dir, name, write_files, runtime=collectives)

    def done(path: str) -> None:
        if manager.main and save_total_limit is not None:  # sees only complete checkpoints
            rotate_checkpoints(
                run_dir, save_total_limit, best_checkpoint, keep=[path, *keep], exclude=exclude
            )
        if on_done is not None:
            on_done(path)

    writer.save(target, {"states": states, "staged": staged}, write, done)
    return True

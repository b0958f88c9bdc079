"""Checkpoint folders: written atomically, found, verified and rotated.

A checkpoint is `output_dir/checkpoint-<global_step>/` (layout in docs/design.md). It is complete or
absent: `write_checkpoint` fills a hidden sibling `.{name}.tmp-<token>`, writes
`checkpoint_complete.json` (every file with its size) last, fsyncs files and folders and renames the
folder into place. The rename is the commit, so a crash at any instant leaves the previous checkpoints
usable; hidden leftovers are ignored by discovery and removed by the next `write_checkpoint`.

Public API (file formats live in `files`, `weights` and `rng`; verification in `verify`):

* `write_checkpoint(output_dir, name, write_fn, *, runtime=None) -> str`: `write_fn(tmp_dir)` writes the
  files; with several processes pass the `Runtime`: every rank calls it with the same `name`, every rank's
  `write_fn` writes its own files (e.g. `rng_state_<rank>.pth`) into the shared folder, rank 0 commits.
  Failures raise `CheckpointError` on every rank and leave earlier checkpoints untouched.
* `get_last_checkpoint(folder) -> str | None`: the newest checkpoint that verifies.
* `sort_checkpoints(...)`, `rotate_checkpoints(...) -> list[str]`: transformers' ordering and
  `save_total_limit` outcomes; the newest and the best checkpoint are never deleted, and a folder is
  renamed out of sight before it is deleted.
* `delete_checkpoint(path)`: rename out of sight, then remove.
* `clean_checkpoint_leftovers(output_dir) -> list[str]`: what `write_checkpoint` does first.

Several processes must share one filesystem: rank 0 lists, fsyncs and renames the folder every rank wrote.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from trainwright.checkpoint.files import (
    CHECKPOINT_COMPLETE_NAME,
    PREFIX_CHECKPOINT_DIR,
    CheckpointError,
    CheckpointWriteError,
    deferred_fsync,
    describe_write_error,
    fsync_dir,
    fsync_file,
    is_write_error,
    write_json,
)
from trainwright.checkpoint.manifest import file_checksum, manifest_for
from trainwright.checkpoint.verify import verify_checkpoint
from trainwright.core.output_lock import moved_since_locked

# `.{name}.tmp-<token>`: being written; `.{name}.old-<token>`: a checkpoint being replaced by a new save
# of the same name; `.{name}.trash-<token>`: being deleted by rotation.
_HIDDEN_RE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old|trash)-(?P<token>[0-9a-f]+-[0-9a-f]+)$")


def _token() -> str:
    return f"{os.getpid():x}-{secrets.token_hex(4)}"


def _step_re(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-(\d+)$")


# -- discovery and rotation ---------------------------------------------------------------------------


def _candidates(folder: str, prefix: str) -> list[tuple[int, str]]:
    """(step, path) of every visible `prefix-<step>` folder, plus the hidden old copy of one whose
    replacement was interrupted between its two renames (the visible name is then absent)."""
    pattern = _step_re(prefix)
    found: dict[int, str] = {}
    hidden: dict[int, str] = {}
    for entry in os.scandir(folder):
        if not entry.is_dir(follow_symlinks=False):
            if entry.is_symlink() and pattern.match(entry.name):
                warnings.warn(f"ignoring {entry.path}: a symbolic link is not a checkpoint", stacklevel=3)
            continue
        if m := pattern.match(entry.name):
            found[int(m.group(1))] = entry.path
        elif (h := _HIDDEN_RE.match(entry.name)) and h["kind"] == "old" and (m := pattern.match(h["name"])):
            hidden.setdefault(int(m.group(1)), entry.path)
    for step, path in hidden.items():
        found.setdefault(step, path)
    return sorted(found.items())


def get_last_checkpoint(
    folder: str | os.PathLike, checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR
) -> str | None:
    """The highest-step checkpoint in `folder` that verifies, or None.

    Temporary folders of interrupted saves are ignored; a damaged folder is skipped with a warning so a
    resume falls back to the previous checkpoint. transformers' checkpoints (no marker) count when they
    hold `trainer_state.json` and weights.
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return None
    for _, path in reversed(_candidates(folder, checkpoint_prefix)):
        problems = verify_checkpoint(path)
        if not problems:
            return path
        warnings.warn(f"skipping incomplete checkpoint {path}: {'; '.join(problems)}", stacklevel=2)
    return None


def sort_checkpoints(
    output_dir: str | os.PathLike,
    checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR,
    use_mtime: bool = False,
    best_model_checkpoint: str | None = None,
) -> list[str]:
    """Visible `checkpoint-<step>` folders, oldest first; the best one moved to second-to-last."""
    output_dir = os.fspath(output_dir)
    pattern = _step_re(checkpoint_prefix)
    entries = []
    for entry in os.scandir(output_dir):
        if entry.is_dir(follow_symlinks=False) and (m := pattern.match(entry.name)):  # never a link
            entries.append(
                (int(m.group(1)), os.path.getmtime(entry.path), os.path.join(output_dir, entry.name))
            )
    entries.sort()
    if use_mtime and len(entries) > 1:
        mtimes = [e[1] for e in entries]
        if max(mtimes) - min(mtimes) < 1.0:
            warnings.warn(
                "checkpoint modification times are less than 1 s apart and may not be reliable on this "
                "filesystem; ordering checkpoints by step instead",
                stacklevel=2,
            )
        else:
            entries.sort(key=lambda e: (e[1], e[0]))
    paths = [e[2] for e in entries]
    if best_model_checkpoint is not None:
        best = os.path.abspath(best_model_checkpoint)
        where = [i for i, p in enumerate(paths) if os.path.abspath(p) == best]
        if where and where[0] < len(paths) - 1:
            best_path = paths.pop(where[0])
            paths.insert(len(paths) - 1, best_path)
    return paths


def delete_checkpoint(path: str | os.PathLike) -> None:
    """Delete a checkpoint folder without ever showing a half-deleted one: hide it, then remove it."""
    parent, name = os.path.split(os.fspath(path).rstrip(os.sep))
    trash = os.path.join(parent, f".{name}.trash-{_token()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def rotate_checkpoints(
    output_dir: str | os.PathLike,
    save_total_limit: int | None = None,
    best_model_checkpoint: str | None = None,
    use_mtime: bool = False,
    checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR,
    *,
    keep: Iterable[str] = (),
    exclude: Iterable[str] = (),
) -> list[str]:
    """Delete the oldest checkpoints beyond `save_total_limit`; returns the deleted paths.

    The newest and the best checkpoint are kept, so with limit 1 and an older best checkpoint two
    remain; so is every path of `keep` (the checkpoint just written, the last one before a run
    diverged). Checkpoints of `exclude` (another run's) are neither counted nor deleted.
    """
    if save_total_limit is None or save_total_limit <= 0:
        return []
    refuse_if_moved(output_dir)
    excluded = {os.path.abspath(p) for p in exclude}
    paths = [
        p
        for p in sort_checkpoints(output_dir, checkpoint_prefix, use_mtime, best_model_checkpoint)
        if os.path.abspath(p) not in excluded
    ]
    if len(paths) <= save_total_limit:
        return []
    n_keep = save_total_limit
    if best_model_checkpoint is not None and n_keep == 1:
        best = os.path.abspath(best_model_checkpoint)
        if best != os.path.abspath(paths[-1]) and best in map(os.path.abspath, paths):
            n_keep = 2
    protected = {os.path.abspath(p) for p in keep}
    deleted = []
    for path in paths[: len(paths) - n_keep]:
        if os.path.abspath(path) in protected:
            continue
        try:
            delete_checkpoint(path)
            deleted.append(path)
        except OSError as exc:
            warnings.warn(f"could not delete old checkpoint {path}: {exc}", stacklevel=2)
    return deleted


def refuse_if_moved(output_dir: str | os.PathLike) -> None:
    """Before deleting anything in `output_dir`: a `CheckpointError` when it is no longer the folder
    this process locked for the run (see `output_lock.moved_since_locked`)."""
    moved = moved_since_locked(os.fspath(output_dir))
    if moved is not None:
        raise CheckpointError(f"{moved} (checkpoint rotation deleted nothing)")


def clean_checkpoint_leftovers(output_dir: str | os.PathLike) -> list[str]:
    """Remove the hidden folders of interrupted saves and deletions; returns what was removed.

    A checkpoint whose replacement was interrupted (`.{name}.old-*` while `name` is absent) is renamed
    back to `name` instead. Meant to run when no other save into `output_dir` is in progress (one trainer
    saves at a time; `write_checkpoint` calls it first).
    """
    output_dir = os.fspath(output_dir)
    removed = []
    for entry in sorted(os.scandir(output_dir), key=lambda e: e.name):
        m = _HIDDEN_RE.match(entry.name)
        if not m or not entry.is_dir(follow_symlinks=False):
            continue
        target = os.path.join(output_dir, m["name"])
        if m["kind"] == "old" and not os.path.lexists(target) and not verify_checkpoint(entry.path):
            os.rename(entry.path, target)
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    if removed:
        fsync_dir(output_dir)
    return removed


# -- atomic write ------------------------------------------------------------------------------------


def _commit(output_dir: str, tmp: str, final: str, name: str) -> None:
    """Record the file list, flush everything to disk, and rename `tmp` to `final` (replacing it)."""
    files = {}
    for root, _, names in os.walk(tmp):
        for n in names:
            full = os.path.join(root, n)
            files[os.path.relpath(full, tmp).replace(os.sep, "/")] = os.path.getsize(full)
    files.pop(CHECKPOINT_COMPLETE_NAME, None)
    paths = [os.path.join(tmp, rel) for rel in files]

    def flush_all() -> None:
        for p in paths:
            fsync_file(p)

    # The data files are flushed on a second thread while this one checksums them from the page
    # cache: fsync waits on the disk without the GIL, so the checksums cost almost no extra time.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        flushed = pool.submit(flush_all)
        checksums = {rel: file_checksum(p) for rel, p in zip(files, paths)}
        flushed.result()
    write_json(os.path.join(tmp, CHECKPOINT_COMPLETE_NAME), manifest_for(name, files, checksums))
    fsync_file(os.path.join(tmp, CHECKPOINT_COMPLETE_NAME))
    for root, _dirs, _names in os.walk(tmp, topdown=False):
        fsync_dir(root)
    if os.path.lexists(final):
        # Same name saved again: a directory can't be renamed over a non-empty one, so the old copy
        # steps aside first. Between the two renames, discovery and cleanup recognise the `.old` copy.
        old = os.path.join(output_dir, f".{name}.old-{_token()}")
        os.rename(final, old)
        try:
            os.rename(tmp, final)
        except BaseException:  # also Ctrl-C between the renames: the old copy goes back
            os.rename(old, final)
            raise
        fsync_dir(output_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
        fsync_dir(output_dir)


def _newest_file(folder: str | None) -> str | None:
    """The file written last under `folder` (often the one a serializer without a file name failed on)."""
    if not folder or not os.path.isdir(folder):
        return None
    newest: tuple[int, str] | None = None
    for root, _, names in os.walk(folder):
        for n in names:
            full = os.path.join(root, n)
            try:
                stamp = os.stat(full).st_mtime_ns
            except OSError:
                continue
            if newest is None or stamp >= newest[0]:
                newest = (stamp, full)
    return os.path.relpath(newest[1], folder) if newest else None


def _failure(output_dir: str, name: str, exc: BaseException, tmp: str | None = None) -> str:
    """`could not write checkpoint 'checkpoint-N' in DIR: CAUSE (FILE)`; call it before `tmp` is removed."""
    where: str | None
    if isinstance(exc, CheckpointWriteError):  # trainwright's writers name the file
        cause, full = exc.cause, exc.disk_full
        where = f"while writing {os.path.relpath(exc.path, tmp) if tmp else exc.path}"
    elif is_write_error(exc):
        cause, full = describe_write_error(exc, tmp or output_dir)
        where = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
        if (
            where is not None
            and tmp
            and os.path.abspath(str(where)).startswith(os.path.abspath(tmp) + os.sep)
        ):
            where = f"while writing {os.path.relpath(where, tmp)}"  # e.g. an fsync that failed (NFS)
        if where is None:  # another serializer (save_pretrained, a custom save_model) that names no file;
            newest = _newest_file(tmp)  # safetensors removes its partial file, so this is only a clue
            where = f"the writer named no file; the newest in the folder is {newest}" if newest else None
    else:
        cause, full, where = f"{type(exc).__name__}: {exc}", False, None
    message = f"could not write checkpoint {name!r} in {output_dir}: {cause}"
    if where:
        message += f" ({where})"
    if full:
        message += (
            f"; the disk of {output_dir} is full (or over quota). Free space there, point output_dir to a "
            "larger disk or lower save_total_limit; earlier checkpoints are untouched"
        )
    return message


def write_checkpoint(
    output_dir: str | os.PathLike,
    name: str,
    write_fn: Callable[[str], Any],
    *,
    runtime: Any = None,
) -> str:
    """Write a checkpoint atomically: `write_fn(tmp_dir)` writes the files; returns the final path.

    `runtime` (a `trainwright.core.runtime.Runtime`) is required when several processes save together;
    every rank must call this. On failure every rank raises `CheckpointError` naming the folder, the file
    and the cause (write errors from `write_fn` are wrapped: `OSError`, torch's serializer `RuntimeError`,
    safetensors' `SafetensorError`; a full disk is named as such even when the serializer does not say so;
    other exceptions propagate unchanged on the rank that raised them), the temporary folder is removed on
    every exit path (KeyboardInterrupt and SystemExit included), and earlier checkpoints are untouched.
    """
    output_dir = os.fspath(output_dir)
    _check_name(name)
    if runtime is None and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise ValueError(
            "write_checkpoint: pass runtime= when several processes save together (WORLD_SIZE > 1)"
        )
    rank = runtime.rank if runtime is not None else 0
    world_size = runtime.world_size if runtime is not None else 1
    final = os.path.join(output_dir, name)

    def from_rank0(value: Any) -> Any:
        # Every rank learns rank 0's outcome; this is also the barrier between the phases.
        return value if world_size == 1 else runtime.broadcast_object(value, src=0)

    tmp, setup_error = from_rank0(_make_tmp(output_dir, name, final) if rank == 0 else (None, None))
    if setup_error:
        raise CheckpointError(setup_error)
    own_error = _write_files(write_fn, tmp, rank)
    statuses = [None if own_error is None else _failure(output_dir, name, own_error, tmp)]
    if world_size > 1:
        statuses = runtime.all_gather_object(statuses[0])
    errors = [f"rank {r}: {s}" if world_size > 1 else s for r, s in enumerate(statuses) if s]
    commit_error = _commit_or_discard(output_dir, tmp, final, name, bool(errors)) if rank == 0 else None
    if errors:
        if own_error is not None and not is_write_error(own_error):
            raise own_error
        cause = own_error.original if isinstance(own_error, CheckpointWriteError) else own_error
        raise CheckpointError("; ".join(errors)) from cause
    commit_error = from_rank0(commit_error)
    if commit_error:
        raise CheckpointError(commit_error)
    return final


def _check_name(name: str) -> None:
    if not name or name != os.path.basename(name) or name.startswith(".") or os.sep in name or "/" in name:
        raise ValueError(
            f"write_checkpoint: name must be a plain folder name like 'checkpoint-500', got {name!r}"
        )


def _make_tmp(output_dir: str, name: str, final: str) -> tuple[str | None, str | None]:
    """Rank 0: the hidden folder the files are written into, or the error that prevents it."""
    tmp = None
    moved = moved_since_locked(output_dir)  # never recreate a removed folder, or write into a new one
    if moved is not None:
        return None, moved
    try:
        if os.path.exists(final) and not os.path.isdir(final):
            raise NotADirectoryError(20, "exists and is not a folder", final)
        os.makedirs(output_dir, exist_ok=True)
        clean_checkpoint_leftovers(output_dir)
        tmp = os.path.join(output_dir, f".{name}.tmp-{_token()}")
        os.mkdir(tmp)
    except OSError as exc:
        return None, _failure(output_dir, name, exc)
    except BaseException:  # KeyboardInterrupt / SystemExit: no hidden folder is left behind
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, None


def _write_files(write_fn: Callable[[str], Any], tmp: str, rank: int) -> Exception | None:
    """This rank's files into `tmp` (fsynced on other ranks; rank 0 flushes the folder when it
    commits); the error, or None. Ctrl-C and exits remove the folder (rank 0) and propagate."""
    try:
        if rank != 0:  # normally a no-op: rank 0 created it on the shared filesystem
            os.makedirs(tmp, exist_ok=True)
        with deferred_fsync() as pending:
            write_fn(tmp)
        if rank != 0:
            for path in pending:
                fsync_file(path)
    except Exception as exc:
        return exc
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return None


def _commit_or_discard(output_dir: str, tmp: str, final: str, name: str, failed: bool) -> str | None:
    """Rank 0: rename the hidden folder into place (or remove it when a rank failed); a write error
    of the commit, or None. The hidden folder never outlives a failure, Ctrl-C included."""
    if failed:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    try:
        _commit(output_dir, tmp, final, name)
    except BaseException as exc:
        message = (
            _failure(output_dir, name, exc, tmp)
            if isinstance(exc, Exception) and is_write_error(exc)
            else None
        )
        shutil.rmtree(tmp, ignore_errors=True)  # any exit path (Ctrl-C included) removes the hidden folder
        if message is None:
            raise
        return message
    return None

"""Checkpoint folders: written atomically, found, verified and rotated.

A checkpoint is `output_dir/checkpoint-<global_step>/` (layout in docs/design.md). It is complete or
absent: `write_checkpoint` fills a hidden sibling `.{name}.tmp-<token>`, writes
`checkpoint_complete.json` (every file with its size) last, fsyncs files and folders and renames the
folder into place. The rename is the commit, so a crash at any instant leaves the previous checkpoints
usable; hidden leftovers are ignored by discovery and removed by the next `write_checkpoint`.

Public API (file formats live in `checkpoint_io` and `rng`, re-exported here):

* `write_checkpoint(output_dir, name, write_fn, *, runtime=None) -> str`: `write_fn(tmp_dir)` writes the
  files; with several processes pass the `Runtime`: every rank calls it with the same `name`, every rank's
  `write_fn` writes its own files (e.g. `rng_state_<rank>.pth`) into the shared folder, rank 0 commits.
  Failures raise `CheckpointError` on every rank and leave earlier checkpoints untouched.
* `get_last_checkpoint(folder) -> str | None`: the newest checkpoint that verifies.
* `verify_checkpoint(path) -> list[str]`: problems (missing files, sizes that differ from the marker).
* `check_checkpoint_files(path, need=(...), *, rank=0, world_size=1) -> list[str]`: the files a resume
  needs, present and readable (JSON parses, archives and safetensors headers intact), before any work.
* `sort_checkpoints(...)`, `rotate_checkpoints(...) -> list[str]`: transformers' ordering and
  `save_total_limit` outcomes; the newest and the best checkpoint are never deleted, and a folder is
  renamed out of sight before it is deleted.
* `delete_checkpoint(path)`: rename out of sight, then remove.
* `clean_checkpoint_leftovers(output_dir) -> list[str]`: what `write_checkpoint` does first.

Several processes must share one filesystem: rank 0 lists, fsyncs and renames the folder every rank wrote.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from trainwright.checkpoint.files import (
    CHECKPOINT_COMPLETE_NAME,
    DATA_STATE_NAME,
    OPTIMIZER_NAME,
    PREFIX_CHECKPOINT_DIR,
    PT_WEIGHTS_INDEX_NAME,
    PT_WEIGHTS_NAME,
    RNG_STATE_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    CheckpointFileNotFoundError,
    CheckpointWriteError,
    WeightsLoadResult,
    deferred_fsync,
    describe_write_error,
    fsync_dir,
    fsync_file,
    is_write_error,
    load_model_weights,
    parse_size,
    read_json,
    safe_torch_load,
    safetensors_problem,
    save_model_weights,
    save_torch_state,
    torch_file_problem,
    write_json,
)
from trainwright.checkpoint.rng import (
    capture_rng_state,
    load_rng_state,
    restore_rng_state,
    rng_state_file,
    save_rng_state,
)

__all__ = [
    "CHECKPOINT_COMPLETE_NAME",
    "DATA_STATE_NAME",
    "OPTIMIZER_NAME",
    "PREFIX_CHECKPOINT_DIR",
    "PT_WEIGHTS_INDEX_NAME",
    "PT_WEIGHTS_NAME",
    "RNG_STATE_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "TRAINER_STATE_NAME",
    "TRAINING_ARGS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "CheckpointError",
    "CheckpointFileNotFoundError",
    "WeightsLoadResult",
    "capture_rng_state",
    "check_checkpoint_files",
    "clean_checkpoint_leftovers",
    "delete_checkpoint",
    "get_last_checkpoint",
    "load_model_weights",
    "load_rng_state",
    "parse_size",
    "read_json",
    "restore_rng_state",
    "rng_state_file",
    "rotate_checkpoints",
    "safe_torch_load",
    "save_model_weights",
    "save_rng_state",
    "save_torch_state",
    "sort_checkpoints",
    "verify_checkpoint",
    "write_checkpoint",
    "write_json",
]

# `.{name}.tmp-<token>`: being written; `.{name}.old-<token>`: a checkpoint being replaced by a new save
# of the same name; `.{name}.trash-<token>`: being deleted by rotation.
_HIDDEN_RE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old|trash)-(?P<token>[0-9a-f]+-[0-9a-f]+)$")


def _token() -> str:
    return f"{os.getpid():x}-{secrets.token_hex(4)}"


def _step_re(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-(\d+)$")


# -- verification -----------------------------------------------------------------------------------


def _weights_problems(path: str) -> list[str]:
    index = os.path.join(path, WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        try:
            weight_map = read_json(index).get("weight_map")
        except (CheckpointError, AttributeError) as exc:
            return [f"{WEIGHTS_INDEX_NAME} is unreadable: {exc}"]
        if not isinstance(weight_map, dict):
            return [f"{WEIGHTS_INDEX_NAME} has no 'weight_map' object"]
        return [
            f"{f} is missing"
            for f in sorted(set(weight_map.values()))
            if not os.path.isfile(os.path.join(path, f))
        ]
    names = (
        WEIGHTS_NAME,
        PT_WEIGHTS_NAME,
        PT_WEIGHTS_INDEX_NAME,
        "adapter_model.safetensors",
        "adapter_model.bin",
    )
    if any(os.path.isfile(os.path.join(path, n)) for n in names):
        return []
    if any(e.startswith("pytorch_model_fsdp") for e in os.listdir(path)):
        return []
    return [f"no model weights ({WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME} or {PT_WEIGHTS_NAME})"]


CHECKSUM_ALGORITHM = "xxh3_64"


def file_checksum(path: str) -> str:
    """xxh3-64 of a file's bytes (about 30 GB/s from the page cache: a few % of a save)."""
    import xxhash

    digest = xxhash.xxh3_64()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                digest.update(view)
    return digest.hexdigest()


def _links_in(path: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(path):
        for n in dirs + names:
            if os.path.islink(os.path.join(root, n)):
                found.append(os.path.relpath(os.path.join(root, n), path))
    return found


def verify_checkpoint(path: str | os.PathLike, checksums: bool = True) -> list[str]:
    """Problems with a checkpoint folder; an empty list means it is complete.

    With `checkpoint_complete.json` every listed file must exist with its recorded size and (when
    `checksums`) its recorded checksum, so same-size damage is caught too. Without it (a folder
    written by transformers, which has no marker) it needs `trainer_state.json` and model weights.
    A checkpoint folder, or anything in it, that is a symbolic link is refused: its files must be
    its own.
    """
    path = os.fspath(path)
    if os.path.islink(path.rstrip(os.sep)):
        return [f"{path} is a symbolic link (a checkpoint folder must be a real folder)"]
    if not os.path.isdir(path):
        return [f"{path} is not a folder"]
    links = _links_in(path)
    if links:
        return [f"{rel} is a symbolic link (a checkpoint's files must be its own)" for rel in links]
    marker = os.path.join(path, CHECKPOINT_COMPLETE_NAME)
    if not os.path.exists(marker):
        problems = (
            []
            if os.path.isfile(os.path.join(path, TRAINER_STATE_NAME))
            else [f"{TRAINER_STATE_NAME} is missing"]
        )
        return problems + _weights_problems(path)
    try:
        manifest = read_json(marker)
        files = manifest.get("files")
    except (CheckpointError, AttributeError) as exc:
        return [f"{CHECKPOINT_COMPLETE_NAME} is unreadable: {exc}"]
    if not isinstance(files, dict):
        return [f"{CHECKPOINT_COMPLETE_NAME} has no 'files' object"]
    sums = manifest.get("checksums") if checksums and manifest.get("checksum") == CHECKSUM_ALGORITHM else None
    problems = []
    for rel, size in sorted(files.items()):
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            problems.append(f"{rel} is missing")
        elif os.path.getsize(full) != size:
            problems.append(f"{rel} has {os.path.getsize(full)} bytes, expected {size}")
        elif isinstance(sums, dict) and rel in sums and file_checksum(full) != sums[rel]:
            problems.append(
                f"{rel} is damaged (its checksum differs from the one recorded when it was written)"
            )
    return problems


NEEDS = ("model", "optimizer", "scheduler", "scaler", "trainer_state", "training_args", "data_state", "rng")


def check_checkpoint_files(
    path: str | os.PathLike,
    need: Iterable[str] = ("model", "optimizer", "scheduler", "trainer_state"),
    *,
    rank: int = 0,
    world_size: int = 1,
) -> list[str]:
    """Which of the files a resume needs are missing or damaged, each message naming file and folder.

    `need` items: "model", "optimizer", "scheduler", "scaler", "trainer_state", "training_args",
    "data_state", "rng" (this rank's file). Checks are cheap (no tensor is loaded): JSON parses,
    `torch.save` archives have an intact zip directory, safetensors sizes match their headers.
    """
    need = list(need)
    unknown = [n for n in need if n not in NEEDS]
    if unknown:
        raise ValueError(f"check_checkpoint_files: unknown need {unknown}; choose from {list(NEEDS)}")
    path = os.fspath(path)
    if not os.path.isdir(path):
        return [f"checkpoint folder {path} does not exist"]
    problems = verify_checkpoint(path) if os.path.exists(os.path.join(path, CHECKPOINT_COMPLETE_NAME)) else []
    torch_files = {"optimizer": OPTIMIZER_NAME, "scheduler": SCHEDULER_NAME, "scaler": SCALER_NAME}
    json_files = {
        "trainer_state": TRAINER_STATE_NAME,
        "training_args": TRAINING_ARGS_NAME,
        "data_state": DATA_STATE_NAME,
    }
    for item in need:
        if item == "model":
            found = _weights_problems(path)
            if not found:
                shards = [WEIGHTS_NAME] if os.path.isfile(os.path.join(path, WEIGHTS_NAME)) else []
                index = os.path.join(path, WEIGHTS_INDEX_NAME)
                if os.path.isfile(index):
                    shards = sorted(set(read_json(index)["weight_map"].values()))
                found = [p for s in shards if (p := safetensors_problem(os.path.join(path, s)))]
            problems += found
        elif item in torch_files:
            problems += [p for p in [torch_file_problem(os.path.join(path, torch_files[item]))] if p]
        elif item in json_files:
            try:
                read_json(os.path.join(path, json_files[item]))
            except CheckpointFileNotFoundError:
                problems.append(f"{json_files[item]} is missing")
            except CheckpointError as exc:
                problems.append(str(exc))
        else:
            rng = rng_state_file(path, rank, world_size)
            problems += [p for p in [torch_file_problem(rng)] if p]
    return [p if path in p else f"{p} (in {path})" for p in dict.fromkeys(problems)]


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
) -> list[str]:
    """Delete the oldest checkpoints beyond `save_total_limit`; returns the deleted paths.

    The newest and the best checkpoint are kept, so with limit 1 and an older best checkpoint two remain.
    """
    if save_total_limit is None or save_total_limit <= 0:
        return []
    paths = sort_checkpoints(output_dir, checkpoint_prefix, use_mtime, best_model_checkpoint)
    if len(paths) <= save_total_limit:
        return []
    keep = save_total_limit
    if best_model_checkpoint is not None and keep == 1:
        best = os.path.abspath(best_model_checkpoint)
        if best != os.path.abspath(paths[-1]) and best in map(os.path.abspath, paths):
            keep = 2
    deleted = []
    for path in paths[: len(paths) - keep]:
        try:
            delete_checkpoint(path)
            deleted.append(path)
        except OSError as exc:
            warnings.warn(f"could not delete old checkpoint {path}: {exc}", stacklevel=2)
    return deleted


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
    manifest = {
        "format": 1,
        "name": name,
        "files": files,
        "checksum": CHECKSUM_ALGORITHM,
        "checksums": checksums,
    }
    write_json(os.path.join(tmp, CHECKPOINT_COMPLETE_NAME), manifest)
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

    `runtime` (a `trainwright.distributed.runtime.Runtime`) is required when several processes save together;
    every rank must call this. On failure every rank raises `CheckpointError` naming the folder, the file
    and the cause (write errors from `write_fn` are wrapped: `OSError`, torch's serializer `RuntimeError`,
    safetensors' `SafetensorError`; a full disk is named as such even when the serializer does not say so;
    other exceptions propagate unchanged on the rank that raised them), the temporary folder is removed on
    every exit path (KeyboardInterrupt and SystemExit included), and earlier checkpoints are untouched.
    """
    output_dir = os.fspath(output_dir)
    if not name or name != os.path.basename(name) or name.startswith(".") or os.sep in name or "/" in name:
        raise ValueError(
            f"write_checkpoint: name must be a plain folder name like 'checkpoint-500', got {name!r}"
        )
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

    tmp, setup_error = None, None
    if rank == 0:
        try:
            if os.path.exists(final) and not os.path.isdir(final):
                raise NotADirectoryError(20, "exists and is not a folder", final)
            os.makedirs(output_dir, exist_ok=True)
            clean_checkpoint_leftovers(output_dir)
            tmp = os.path.join(output_dir, f".{name}.tmp-{_token()}")
            os.mkdir(tmp)
        except OSError as exc:
            setup_error = _failure(output_dir, name, exc)
        except BaseException:  # KeyboardInterrupt / SystemExit: no hidden folder is left behind
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
    tmp, setup_error = from_rank0((tmp, setup_error))
    if setup_error:
        raise CheckpointError(setup_error)

    own_error: BaseException | None = None
    try:
        if rank != 0:  # normally a no-op: rank 0 created it on the shared filesystem
            os.makedirs(tmp, exist_ok=True)
        with deferred_fsync() as pending:
            write_fn(tmp)
        if rank != 0:  # rank 0 flushes the whole folder when it commits
            for path in pending:
                fsync_file(path)
    except Exception as exc:
        own_error = exc
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    statuses = [None if own_error is None else _failure(output_dir, name, own_error, tmp)]
    if world_size > 1:
        statuses = runtime.all_gather_object(statuses[0])
    errors = [f"rank {r}: {s}" if world_size > 1 else s for r, s in enumerate(statuses) if s]

    commit_error = None
    if rank == 0:
        if errors:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            try:
                _commit(output_dir, tmp, final, name)
            except BaseException as exc:  # any exit path (Ctrl-C included) removes the hidden folder
                if isinstance(exc, Exception) and is_write_error(exc):
                    commit_error = _failure(output_dir, name, exc, tmp)
                shutil.rmtree(tmp, ignore_errors=True)
                if commit_error is None:
                    raise
    if errors:
        if own_error is not None and not is_write_error(own_error):
            raise own_error
        cause = own_error.original if isinstance(own_error, CheckpointWriteError) else own_error
        raise CheckpointError("; ".join(errors)) from cause
    commit_error = from_rank0(commit_error)
    if commit_error:
        raise CheckpointError(commit_error)
    return final

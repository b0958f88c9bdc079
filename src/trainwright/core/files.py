"""Files written whole or not at all, with the mode the umask gives, and JSON read with errors naming
the file. Every writer of the package that replaces a file goes through `atomic_write`.

* `atomic_write(path, mode="w")`: a context manager yielding a file object on a hidden sibling
  (`.{name}.tmp-<pid>-<token>`), flushed, fsynced and renamed over `path` when the block ends (removed
  if it raises), so a reader sees the old file or the new one, never half of one. The file gets the
  mode a plain `open(path, "w")` gives (0o666 less the umask; 0644 under umask 022), which
  `tempfile.mkstemp` (always 0600) would not.
* `write_json(path, obj, indent=2)` / `read_json(path)` / `read_json_object(path)`: the one JSON writer
  (sorted keys, atomic) and readers (`JSONFileError`, a `ValueError` naming the file, line and column;
  a missing file is a `FileNotFoundError` naming it).
* `honour_umask(path)`: give a file written by another library through its own temporary file
  (safetensors writes 0600) the umask's mode.
* `deferred_fsync()`, `make_durable(path)`, `fsync_file`, `fsync_dir`: inside the block, writers
  record their files instead of fsyncing each (checkpoints flush them together at the commit).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import secrets
from collections.abc import Iterator
from typing import IO, Any


class JSONFileError(ValueError):
    """A JSON file that cannot be read as expected; the message names the file."""


# -- durability -------------------------------------------------------------------------------------


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file's data to stable storage; an error names the file (NFS and other network
    filesystems report a full disk or quota only here)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from exc
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (creations, renames) to stable storage; a no-op where folders can't be opened."""
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_PENDING_FSYNC: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "pending_fsync", default=None
)


@contextlib.contextmanager
def deferred_fsync() -> Iterator[list[str]]:
    """Within the block, writers record their files in the yielded list instead of fsyncing them."""
    pending: list[str] = []
    token = _PENDING_FSYNC.set(pending)
    try:
        yield pending
    finally:
        _PENDING_FSYNC.reset(token)


def make_durable(path: str) -> None:
    """fsync `path` now, or inside `deferred_fsync()` record it for the block's owner."""
    pending = _PENDING_FSYNC.get()
    if pending is None:
        fsync_file(path)
    else:
        pending.append(path)


# -- modes ------------------------------------------------------------------------------------------


def current_umask() -> int:
    """The process's umask, read without changing it where the kernel reports it (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # Elsewhere the only way is to set it and put it back (a moment in which another thread's new
    # file would get mode 0o666 less 0o022 rather than less the real umask).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: str | os.PathLike) -> None:
    """Set `path` to the mode a plain `open(path, "w")` would have given it (0o666 less the umask)."""
    os.chmod(path, 0o666 & ~current_umask())


# -- atomic replacement ------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8", newline: str | None = None
) -> Iterator[IO[Any]]:
    """Yield a file whose content replaces `path` when the block ends (see the module docstring)."""
    path = os.fspath(path)
    folder, base = os.path.split(path)
    tmp = os.path.join(folder, f".{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    # O_CREAT's 0o666 is filtered by the umask, as for open(path, "w")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    binary = "b" in mode
    try:
        with os.fdopen(
            fd, mode, encoding=None if binary else encoding, newline=None if binary else newline
        ) as f:
            yield f
            f.flush()
            if _PENDING_FSYNC.get() is None:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if _PENDING_FSYNC.get() is not None:
        make_durable(path)


# -- JSON -------------------------------------------------------------------------------------------


def write_json(path: str | os.PathLike, obj: Any, *, indent: int = 2, end: str = "\n") -> None:
    """Write `obj` as indented JSON with sorted keys, then `end`, through `atomic_write`; a value
    JSON cannot hold raises `JSONFileError` naming the file before anything is written."""
    path = os.fspath(path)
    try:
        text = json.dumps(obj, indent=indent, sort_keys=True) + end
    except (TypeError, ValueError) as exc:
        raise JSONFileError(f"cannot write {path}: {exc}") from exc
    with atomic_write(path) as f:
        f.write(text)


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value in `path`; a missing file raises `FileNotFoundError`, an unreadable one
    `JSONFileError`, each naming the file."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise JSONFileError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except UnicodeDecodeError as exc:
        raise JSONFileError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise JSONFileError(
            f"{path} is nested too deeply to be read (damaged, or not the file it should be)"
        ) from None


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """`read_json` for a file that must hold a JSON object."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise JSONFileError(f"{os.fspath(path)} must hold a JSON object, found {type(value).__name__}")
    return value

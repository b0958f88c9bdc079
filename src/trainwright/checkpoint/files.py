"""The files inside a checkpoint folder: names, torch state, JSON, durable writes; nothing is ever
unpickled. Model weights (safetensors, `save_pretrained`) are in `weights.py`.

Public API (re-exported by `trainwright.checkpoint`):

* File names: `WEIGHTS_NAME`, `WEIGHTS_INDEX_NAME`, `PT_WEIGHTS_NAME`, `PT_WEIGHTS_INDEX_NAME`,
  `OPTIMIZER_NAME`, `SCHEDULER_NAME`, `SCALER_NAME`, `TRAINER_STATE_NAME`, `TRAINING_ARGS_NAME`,
  `TRAINING_ARGS_BIN_NAME`, `DATA_STATE_NAME`, `RNG_STATE_NAME`, `BATCH_IN_HAND_NAME`,
  `CHECKPOINT_COMPLETE_NAME`.
* Errors: `CheckpointError` (a `RuntimeError`); `CheckpointFileNotFoundError` is also a
  `FileNotFoundError`. Messages name the file and the folder.
* `safe_torch_load(path, map_location="cpu")`: `torch.load(weights_only=True)` with clear errors.
* `save_torch_state(state, path)`: `torch.save` of a state dict after checking that
  `weights_only=True` will be able to read it back.
* `save_tensors_state(state, path)` / `load_tensors_state(path)`: a state of named tensors and string
  metadata (`{"tensors": ..., "metadata": ...}`) as a safetensors file (the batch in hand).
* `write_json(path, obj)` (atomic, fsynced) / `read_json(path)`: `core/files.py`'s, with a
  `CheckpointError` naming the file.
* `write_training_args(folder, arguments)`: `training_args.json` and `training_args.bin`.
* `fsync_file(path)`, `fsync_dir(path)`, `deferred_fsync()`, `make_durable(path)`, `honour_umask(path)`:
  re-exported from `core/files.py`.

Every writer here makes its file durable (fsync) before returning, except inside `deferred_fsync()`,
which `write_checkpoint` uses: there the paths are collected and flushed together at the commit, which
lets the kernel write one file back while the next is being serialized.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import pickle
import re
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from trainwright.core import files
from trainwright.core.files import (  # noqa: F401  (re-exported for the checkpoint layer)
    deferred_fsync,
    fsync_dir,
    fsync_file,
    honour_umask,
    make_durable,
)
from trainwright.core.units import parse_size  # noqa: F401  (re-exported: weights.py and older imports)

PREFIX_CHECKPOINT_DIR = "checkpoint"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PT_WEIGHTS_NAME = "pytorch_model.bin"
PT_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.json"
TRAINING_ARGS_BIN_NAME = "training_args.bin"  # upstream's name; written for the tools that look for it
DATA_STATE_NAME = "data_state.json"
BASE_MODEL_NAME = "base_model.json"  # a PEFT model's checkpoint: the base its adapters were trained on
TF_CHECKPOINT_PREFIX = "tf_checkpoint"  # TFTrainer's variables: tf_checkpoint.index and its data shards
RNG_STATE_NAME = "rng_state.pth"
BATCH_IN_HAND_NAME = (
    "batch_in_hand.safetensors"  # the training batch fetched ahead of the next step, per process
)
CHECKPOINT_COMPLETE_NAME = "checkpoint_complete.json"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file or folder."""


class CheckpointFileNotFoundError(CheckpointError, FileNotFoundError):
    """A file that a checkpoint should contain is missing."""


# -- small file helpers ---------------------------------------------------------------------------


# What torch's serializer says when a write fails: its zip writer (`[enforce fail at
# inline_container.cc:672] ... unexpected pos`), and the C++ stream it writes through, which on a full
# disk fails only when the end of a small file is flushed (`basic_ios::clear: iostream error`;
# libc++: `ios_base::clear: unspecified iostream_category error`).
_TORCH_WRITE_ERRORS = (
    "inline_container",
    "PytorchStreamWriter",
    "file write failed",
    "basic_ios",
    "iostream",
)


def is_write_error(exc: BaseException) -> bool:
    """An error from writing a file: OSError, torch's serializer (a RuntimeError, see
    `_TORCH_WRITE_ERRORS`), safetensors' SafetensorError."""
    if isinstance(exc, (OSError, CheckpointWriteError)):
        return True
    if type(exc).__name__ == "SafetensorError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(marker in text for marker in _TORCH_WRITE_ERRORS)


# Below this many free bytes a write error from a serializer that does not report errno (torch's
# `unexpected pos 576 vs 534`) is reported as a full disk.
_FULL_DISK_BYTES = 1 << 20


def _free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    root = hasattr(os, "geteuid") and os.geteuid() == 0  # root may write into the reserved blocks
    return (st.f_bfree if root else st.f_bavail) * st.f_frsize


def describe_write_error(exc: BaseException, where: str) -> tuple[str, bool]:
    """(cause, disk_full) of a write error; `where` is a path on the filesystem written to. A full disk
    is recognised from errno, from the message, or (torch's serializer says only `unexpected pos`)
    from the free space left; call it before the partial file is removed."""
    text = str(exc)
    full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
        t in text for t in ("No space left", "os error 28")
    )
    if not full and not isinstance(exc, OSError):
        free = _free_bytes(where)
        full = free is not None and free < _FULL_DISK_BYTES
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror, full
    if full:
        first = (text.strip().splitlines() or [""])[0]
        return f"{os.strerror(errno.ENOSPC)} (the writer said: {type(exc).__name__}: {first})", True
    return f"{type(exc).__name__}: {exc}", False


class CheckpointWriteError(CheckpointError):
    """Writing `path` failed (a full disk, an I/O error); `original` (also `__cause__`) is the
    serializer's own error, which may name neither the file nor the cause."""

    def __init__(self, path: str, original: BaseException) -> None:
        self.path, self.original = path, original
        self.cause, self.disk_full = describe_write_error(original, os.path.dirname(path) or ".")
        hint = "; the disk is full (or over quota): free space there or write elsewhere"
        hint = hint if self.disk_full else ""
        super().__init__(f"could not write {path}: {self.cause}{hint}")


@contextlib.contextmanager
def writing_file(path: str) -> Iterator[None]:
    """Errors of the serializer writing `path` become a `CheckpointWriteError` naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as exc:
        if not is_write_error(exc):
            raise
        raise CheckpointWriteError(path, exc) from exc


def file_missing(path: str) -> CheckpointFileNotFoundError:
    folder = os.path.dirname(os.path.abspath(path))
    return CheckpointFileNotFoundError(f"{os.path.basename(path)} is missing from checkpoint folder {folder}")


# -- JSON -------------------------------------------------------------------------------------------


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON: to a hidden sibling first, fsynced, then renamed over `path`
    (`core.files.write_json`); a value JSON cannot hold is a `CheckpointError` naming the file, and
    so is a write error (a `CheckpointWriteError`)."""
    try:
        with writing_file(os.fspath(path)):  # a full disk names the file
            files.write_json(path, obj)
    except files.JSONFileError as exc:
        raise CheckpointError(str(exc)) from exc.__cause__


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a missing or corrupt file raises a `CheckpointError` naming it."""
    try:
        return files.read_json(path)
    except FileNotFoundError:
        raise file_missing(os.fspath(path)) from None
    except files.JSONFileError as exc:
        raise CheckpointError(str(exc)) from None


# -- torch.save / torch.load ----------------------------------------------------------------------

_PLAIN_TYPES = frozenset(
    {type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size}
)
_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})


def _check_weights_only(obj: Any, where: str, path: str) -> None:
    kind = type(obj)
    if kind in _PLAIN_TYPES or kind in _TENSOR_TYPES:
        return
    if kind in (dict, OrderedDict):
        for key, value in obj.items():
            _check_weights_only(key, f"{where} key {key!r}", path)
            _check_weights_only(value, f"{where}[{key!r}]", path)
        return
    if kind in (list, tuple, set):
        for i, value in enumerate(obj):
            _check_weights_only(value, f"{where}[{i}]", path)
        return
    raise CheckpointError(
        f"cannot save {path}: {where} is a {kind.__module__}.{kind.__qualname__}, which "
        "torch.load(weights_only=True) refuses; store tensors, numbers, strings and plain containers only"
    )


def save_torch_state(state: Any, path: str | os.PathLike) -> None:
    """`torch.save` a state dict (optimizer, scheduler, scaler, RNG) and fsync it.

    The object is checked first: anything `torch.load(weights_only=True)` would refuse raises a
    `CheckpointError` naming the offending entry, so a checkpoint that cannot be resumed is never written.
    """
    path = os.fspath(path)
    _check_weights_only(state, "state", path)
    with writing_file(path):
        torch.save(state, path)
    make_durable(path)


def save_tensors_state(state: Mapping[str, Any], path: str | os.PathLike) -> None:
    """`state["tensors"]` (names to tensors, each its own storage) with `state["metadata"]` (strings)
    as a safetensors file, fsynced."""
    from safetensors.torch import save_file

    path = os.fspath(path)
    with writing_file(path):
        save_file(dict(state["tensors"]), path, metadata=dict(state["metadata"]))
        honour_umask(path)  # safetensors writes through a temporary file of mode 0600
    make_durable(path)


def load_tensors_state(path: str | os.PathLike) -> dict[str, Any]:
    """The state `save_tensors_state` wrote (tensors on the CPU, in the file's order); a missing or
    damaged file is a `CheckpointError` naming it."""
    from safetensors import SafetensorError, safe_open

    path = os.fspath(path)
    if not os.path.exists(path):
        raise file_missing(path)
    try:
        with safe_open(path, framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in f.keys()}
            metadata = dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is damaged: {exc}") from exc
    return {"tensors": tensors, "metadata": metadata}


def write_training_args(folder: str | os.PathLike, arguments: dict[str, Any]) -> None:
    """`training_args.json`, and `training_args.bin` for the tools and tests that look for
    upstream's file: the same plain dict (the JSON's content, so tuples are lists) through
    `torch.save`, which `torch.load(weights_only=True)` reads. Upstream pickles the
    `TrainingArguments` object there; trainwright never reads the .bin back (the JSON is its record).
    """
    folder = os.fspath(folder)
    write_json(os.path.join(folder, TRAINING_ARGS_NAME), arguments)
    plain = json.loads(json.dumps(arguments, sort_keys=True))
    save_torch_state(plain, os.path.join(folder, TRAINING_ARGS_BIN_NAME))


def _unpickle_reason(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
        if line.startswith("Unsupported") or "not an allowed global" in line:
            return line
    return "it holds objects other than tensors and plain containers"


def _names_a_real_global(reason: str) -> bool:
    """Whether a weights-only refusal names an importable object (a pickle that asks for code), as
    opposed to a name or opcode that exists nowhere (a damaged file)."""
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", reason)
    if m is None:
        return True  # e.g. an opcode torch's weights-only reader does not take: a pickle of other things
    module, _, name = m.group(1).rpartition(".")
    try:
        return hasattr(importlib.import_module(module or "builtins"), name)
    except Exception:  # not importable: the name itself is garbled
        return False


def safe_torch_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """`torch.load(path, weights_only=True)`: tensors and plain containers only, never code.

    A missing file raises `CheckpointFileNotFoundError` naming the file and its folder; a file that needs
    arbitrary unpickling raises `CheckpointError("refusing to unpickle ...")`; a damaged file raises
    `CheckpointError` naming it.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise file_missing(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = _unpickle_reason(exc)
        if not _names_a_real_global(reason):  # garbled opcodes or names: damage, not a payload
            raise CheckpointError(f"could not read {path}: the file is damaged ({reason})") from None
        raise CheckpointError(
            f"refusing to unpickle {path}: loading it would need arbitrary unpickling, which can run code "
            f"({reason})"
        ) from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"could not read {path}: {exc}") from exc


# -- cheap integrity checks (used to validate a checkpoint before loading it) ----------------------


def torch_file_problem(path: str) -> str | None:
    """Why a `torch.save` file is missing or damaged (zip directory unreadable), or None."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        return f"{name} is missing"
    if os.path.getsize(path) == 0:
        return f"{name} is empty"
    if zipfile.is_zipfile(path):
        return None
    with open(path, "rb") as f:
        if f.read(1) == b"\x80":  # the legacy (pre-zip) torch.save format starts with a pickle opcode
            return None
    return f"{name} is corrupt (not a torch.save archive)"

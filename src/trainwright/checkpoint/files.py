"""The files inside a checkpoint folder: names, weights, torch state, JSON; nothing is ever unpickled.

Public API (re-exported by `trainwright.checkpoint.folder`):

* File names: `WEIGHTS_NAME`, `WEIGHTS_INDEX_NAME`, `PT_WEIGHTS_NAME`, `PT_WEIGHTS_INDEX_NAME`,
  `OPTIMIZER_NAME`, `SCHEDULER_NAME`, `SCALER_NAME`, `TRAINER_STATE_NAME`, `TRAINING_ARGS_NAME`,
  `DATA_STATE_NAME`, `RNG_STATE_NAME`, `CHECKPOINT_COMPLETE_NAME`.
* Errors: `CheckpointError` (a `RuntimeError`); `CheckpointFileNotFoundError` is also a
  `FileNotFoundError`. Messages name the file and the folder.
* `save_model_weights(model, directory, *, max_shard_size="5GB", state_dict=None, is_main_process=True)`:
  a transformers `PreTrainedModel` goes through `save_pretrained` (so `from_pretrained` reads it); any
  other module is written with safetensors (`{"format": "pt"}` metadata), one name kept per shared
  storage and the other names recorded as aliases, sharded as `model-0000i-of-0000n.safetensors` +
  `model.safetensors.index.json` above `max_shard_size`.
* `load_model_weights(model, directory, strict=True) -> WeightsLoadResult`: reads what
  `save_model_weights` or transformers wrote (`model.safetensors`, its sharded index, or
  `pytorch_model.bin` through `torch.load(weights_only=True)`); keys and shapes are checked before any
  weight is copied.
* `safe_torch_load(path, map_location="cpu")`: `torch.load(weights_only=True)` with clear errors.
* `save_torch_state(state, path)`: `torch.save` of a state dict after checking that
  `weights_only=True` will be able to read it back.
* `write_json(path, obj)` (atomic, fsynced) / `read_json(path)`.
* `parse_size("5GB") -> int`, `fsync_file(path)`, `fsync_dir(path)`.

Every writer here makes its file durable (fsync) before returning, except inside `deferred_fsync()`,
which `write_checkpoint` uses: there the paths are collected and flushed together at the commit, which
lets the kernel write one file back while the next is being serialized.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import importlib
import inspect
import json
import os
import pickle
import re
import struct
import sys
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard, cast

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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
DATA_STATE_NAME = "data_state.json"
RNG_STATE_NAME = "rng_state.pth"
CHECKPOINT_COMPLETE_NAME = "checkpoint_complete.json"

# Safetensors metadata key (and index metadata key) holding {alias: kept_name} for shared tensors.
ALIASES_KEY = "trainwright_aliases"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file or folder."""


class CheckpointFileNotFoundError(CheckpointError, FileNotFoundError):
    """A file that a checkpoint should contain is missing."""


class WeightsLoadResult(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


# -- small file helpers ---------------------------------------------------------------------------


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file's data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
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


def is_write_error(exc: BaseException) -> bool:
    """An error from writing a file: OSError, torch's serializer (a RuntimeError such as
    `[enforce fail at inline_container.cc:672] ... unexpected pos`), safetensors' SafetensorError."""
    if isinstance(exc, (OSError, CheckpointWriteError)):
        return True
    if type(exc).__name__ == "SafetensorError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("inline_container", "PytorchStreamWriter", "file write failed")
    )


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
def _writing(path: str) -> Iterator[None]:
    """Errors of the serializer writing `path` become a `CheckpointWriteError` naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as exc:
        if not is_write_error(exc):
            raise
        raise CheckpointWriteError(path, exc) from exc


def _make_durable(path: str) -> None:
    pending = _PENDING_FSYNC.get()
    if pending is None:
        fsync_file(path)
    else:
        pending.append(path)


def _missing(path: str) -> CheckpointFileNotFoundError:
    folder = os.path.dirname(os.path.abspath(path))
    return CheckpointFileNotFoundError(f"{os.path.basename(path)} is missing from checkpoint folder {folder}")


def _preview(keys: Iterable[str], limit: int = 10) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)})"


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)


def parse_size(size: int | str) -> int:
    """Bytes in `size`: an int, or a string like "5GB" (10**9), "500MB", "2GiB" (2**30)."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif isinstance(size, str) and (m := _SIZE_RE.match(size)):
        value = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
    else:
        raise ValueError(
            f"max_shard_size must be a positive int or a string like '5GB' or '500MB', got {size!r}"
        )
    if value <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return value


# -- JSON -------------------------------------------------------------------------------------------


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON: to a hidden sibling first, fsynced, then renamed over `path`."""
    path = os.fspath(path)
    try:
        text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"cannot write {path}: {exc}") from exc
    folder, base = os.path.split(path)
    tmp = os.path.join(folder, f".{base}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if _PENDING_FSYNC.get() is None:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if _PENDING_FSYNC.get() is not None:
            _make_durable(path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a missing or corrupt file raises an error naming it."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise _missing(path) from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None


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
    with _writing(path):
        torch.save(state, path)
    _make_durable(path)


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
        raise _missing(path)
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


# -- model weights ----------------------------------------------------------------------------------


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state_dict keys are the model's own (no DDP `module.` / compile `_orig_mod.`)."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = cast(torch.nn.Module, model._orig_mod)  # checked just above
        else:
            return model


def _is_pretrained_model(model: torch.nn.Module) -> TypeGuard[PreTrainedModel]:
    # An instance of a transformers class implies transformers is imported; never import it ourselves.
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def _view_key(t: torch.Tensor) -> tuple | None:
    """Identity of the memory a tensor views; None for tensors that cannot share (empty, meta)."""
    if t.device.type == "meta" or t.numel() == 0:
        return None
    storage = t.untyped_storage()
    if storage.data_ptr() == 0:
        return None
    return (t.device, storage.data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _split_shared(state_dict: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors safetensors can store (one name per storage) and {alias: kept_name} for identical views."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    views: dict[tuple, str] = {}
    storages: set[tuple] = set()
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(
                f"state_dict[{name!r}] is a {type(t).__name__}; safetensors stores tensors only"
            )
        key = _view_key(t)
        if key is not None:
            if key in views:
                aliases[name] = views[key]
                continue
            if key[:2] in storages:
                # A different view of memory another entry uses (e.g. a slice of a fused weight):
                # safetensors refuses shared storage, so this one is stored as its own copy.
                t = t.clone()
            views[key] = name
            storages.add(key[:2])
        tensors[name] = t.detach().contiguous()
    return tensors, aliases


def _plan_shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _remove_stale_weights(directory: str, keep: set[str]) -> None:
    for entry in os.listdir(directory):
        if entry in keep:
            continue
        if entry in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME) or _SHARD_RE.match(entry):
            os.unlink(os.path.join(directory, entry))


def _save_state_dict(state_dict: Mapping[str, Any], directory: str, max_bytes: int) -> list[str]:
    tensors, aliases = _split_shared(state_dict)
    shards = _plan_shards(tensors, max_bytes)
    metadata = {"format": "pt"}
    if len(shards) == 1:
        if aliases:
            metadata[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
        names = {WEIGHTS_NAME: shards[0]}
    else:
        n = len(shards)
        names = {f"model-{i + 1:05d}-of-{n:05d}.safetensors": shard for i, shard in enumerate(shards)}
    for filename, keys in names.items():
        path = os.path.join(directory, filename)
        with _writing(path):
            save_file({k: tensors[k] for k in keys}, path, metadata=metadata)
        _make_durable(path)
    written = list(names)
    if len(shards) > 1:
        index_meta: dict[str, Any] = {
            "total_size": sum(t.numel() * t.element_size() for t in tensors.values())
        }
        if aliases:
            index_meta[ALIASES_KEY] = aliases
        weight_map = {k: f for f, keys in names.items() for k in keys}
        write_json(
            os.path.join(directory, WEIGHTS_INDEX_NAME), {"metadata": index_meta, "weight_map": weight_map}
        )
        written.append(WEIGHTS_INDEX_NAME)
    _remove_stale_weights(directory, set(written))
    return written


def save_model_weights(
    model: torch.nn.Module,
    directory: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    state_dict: Mapping[str, torch.Tensor] | None = None,
    is_main_process: bool = True,
) -> None:
    """Write a model's weights into `directory` as safetensors (see the module docstring for the layout)."""
    directory = os.fspath(directory)
    max_bytes = parse_size(max_shard_size)
    model = _unwrap(model)
    if _is_pretrained_model(model):
        kwargs: dict[str, Any] = {"is_main_process": is_main_process, "state_dict": state_dict}
        if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
            kwargs["safe_serialization"] = True  # transformers v4; v5 always writes safetensors
        from trainwright.core.third_party import deepspeed_left_unimported

        with deepspeed_left_unimported():  # accelerate would import it (seconds, a warning) to unwrap
            model.save_pretrained(directory, max_shard_size=max_bytes, **kwargs)
        return
    if not is_main_process:
        return
    os.makedirs(directory, exist_ok=True)
    _save_state_dict(model.state_dict() if state_dict is None else state_dict, directory, max_bytes)


class _WeightFiles(NamedTuple):
    kind: str  # "safetensors" or "pt"
    files: list[str]
    aliases: dict[str, str]
    described: str  # what the error messages call it


def _shard_files(directory: str, index_name: str) -> tuple[list[str], dict]:
    index_path = os.path.join(directory, index_name)
    index = read_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_path} has no 'weight_map' object")
    files = []
    for name in dict.fromkeys(weight_map.values()):
        path = contained_path(directory, name, index_path)
        if not os.path.isfile(path):
            raise _missing(path)
        files.append(path)
    return files, index


def contained_path(directory: str, name: Any, source: str) -> str:
    """`directory/name`, refused (naming `source`, the file that named it) unless it is a plain file
    name inside `directory`: no absolute path, no `..`, no symbolic link out of the folder."""
    if (
        not isinstance(name, str)
        or not name
        or os.path.isabs(name)
        or ".." in name.replace("\\", "/").split("/")
    ):
        raise CheckpointError(f"{source} names {name!r}, which is not a file inside {directory}: refused")
    path = os.path.join(directory, name)
    if os.path.islink(path) or not os.path.realpath(path).startswith(os.path.realpath(directory) + os.sep):
        raise CheckpointError(f"{path} is a symbolic link or leaves {directory}: refused")
    return path


def _find_weight_files(directory: str) -> _WeightFiles:
    if not os.path.isdir(directory):
        raise CheckpointFileNotFoundError(f"checkpoint folder {directory} does not exist")
    join = os.path.join
    links = [
        n
        for n in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, PT_WEIGHTS_NAME, PT_WEIGHTS_INDEX_NAME)
        if os.path.islink(join(directory, n))
    ]
    if links:
        raise CheckpointError(
            f"{join(directory, links[0])} is a symbolic link: a checkpoint's files must be its own"
        )
    if os.path.isfile(join(directory, WEIGHTS_INDEX_NAME)):
        files, index = _shard_files(directory, WEIGHTS_INDEX_NAME)
        aliases = (index.get("metadata") or {}).get(ALIASES_KEY) or {}
        return _WeightFiles("safetensors", files, dict(aliases), join(directory, WEIGHTS_INDEX_NAME))
    if os.path.isfile(join(directory, WEIGHTS_NAME)):
        path = join(directory, WEIGHTS_NAME)
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
        except Exception as exc:  # safetensors raises its own error types for damaged headers
            raise CheckpointError(f"could not read {path}: {exc}") from exc
        aliases = json.loads(meta[ALIASES_KEY]) if ALIASES_KEY in meta else {}
        return _WeightFiles("safetensors", [path], aliases, path)
    if os.path.isfile(join(directory, PT_WEIGHTS_INDEX_NAME)):
        files, _ = _shard_files(directory, PT_WEIGHTS_INDEX_NAME)
        return _WeightFiles("pt", files, {}, join(directory, PT_WEIGHTS_INDEX_NAME))
    if os.path.isfile(join(directory, PT_WEIGHTS_NAME)):
        path = join(directory, PT_WEIGHTS_NAME)
        return _WeightFiles("pt", [path], {}, path)
    raise CheckpointFileNotFoundError(
        f"no model weights in checkpoint folder {directory}: expected {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME} "
        f"or {PT_WEIGHTS_NAME}"
    )


def _safetensors_shapes(path: str) -> dict[str, tuple[int, ...]]:
    try:
        with safe_open(path, framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for damaged headers
        raise CheckpointError(f"could not read {path}: {exc}") from exc


def load_model_weights(
    model: torch.nn.Module, directory: str | os.PathLike, strict: bool = True
) -> WeightsLoadResult:
    """Load weights written by `save_model_weights` (or by transformers) into `model`.

    Aliases recorded at save time are filled in, and a key the file lacks is not missing when the model
    ties it to a key the file has (transformers drops tied weights such as `lm_head.weight`). With
    `strict=True` any missing or unexpected key raises `CheckpointError` before anything is copied; with
    `strict=False` they are returned and warned about. Shape mismatches always raise.
    """
    directory = os.fspath(directory)
    found = _find_weight_files(directory)
    model = _unwrap(model)
    own = model.state_dict()

    loaded: dict[str, torch.Tensor] = {}
    if found.kind == "pt":
        for path in found.files:
            chunk = safe_torch_load(path)
            if not isinstance(chunk, dict):
                raise CheckpointError(f"{path} holds a {type(chunk).__name__}, expected a state dict")
            loaded.update(chunk)
        shapes = {k: tuple(v.shape) for k, v in loaded.items()}
    else:
        shapes = {}
        for path in found.files:
            shapes.update(_safetensors_shapes(path))
    present = set(shapes) | {a for a, kept in found.aliases.items() if kept in shapes}

    # Keys the model ties together share memory: loading any one of them fills the others.
    by_view: dict[tuple, list[str]] = {}
    for k, t in own.items():
        key = _view_key(t)
        if key is not None:
            by_view.setdefault(key, []).append(k)
    tied_present = {
        k for names in by_view.values() if any(n in present for n in names) for k in names if k not in present
    }
    missing = [k for k in own if k not in present and k not in tied_present]
    unexpected = sorted(k for k in present if k not in own)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing keys {_preview(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_preview(unexpected)}")
        raise CheckpointError(f"{found.described} does not match the model: " + "; ".join(parts))
    alias_of = {a: kept for a, kept in found.aliases.items() if kept in shapes}
    # A buffer may change shape (a growing memory, a resized cache): the model's own
    # load_state_dict / _load_from_state_dict decides, as upstream lets it; parameters must match.
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    wrong = [
        f"{k}: file {shapes[alias_of.get(k, k)]} vs model {tuple(own[k].shape)}"
        for k in present
        if k in own and k in params and shapes[alias_of.get(k, k)] != tuple(own[k].shape)
    ]
    if wrong:
        raise CheckpointError(f"{found.described} has tensors of the wrong shape: {'; '.join(wrong[:10])}")

    if found.kind == "pt":
        chunks: Iterable[dict[str, torch.Tensor]] = [loaded]
    else:
        chunks = (load_file(path, device="cpu") for path in found.files)
    for chunk in chunks:
        for alias, kept in alias_of.items():
            if kept in chunk:
                chunk[alias] = chunk[kept]
        try:
            model.load_state_dict({k: v for k, v in chunk.items() if k in own}, strict=False)
        except RuntimeError as exc:  # e.g. a buffer of another shape the model does not resize
            raise CheckpointError(
                f"{found.described} does not load into {type(model).__name__}: {exc}"
            ) from exc
    if missing or unexpected:
        warnings.warn(
            f"{found.described}: missing keys {_preview(missing)}, unexpected keys {_preview(unexpected)}",
            stacklevel=2,
        )
    return WeightsLoadResult(missing, unexpected)


# -- cheap integrity checks (used to validate a checkpoint before loading it) ----------------------


def safetensors_problem(path: str) -> str | None:
    """Why a safetensors file is unreadable or truncated (header vs size), or None if it looks whole."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{os.path.basename(path)} is truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{os.path.basename(path)} is truncated (header of {n} bytes, file of {size})"
            header = json.loads(f.read(n))
    except FileNotFoundError:
        return f"{os.path.basename(path)} is missing"
    except (OSError, ValueError) as exc:
        return f"{os.path.basename(path)} is corrupt: {exc}"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        return f"{os.path.basename(path)} has {size} bytes, its header describes {8 + n + end}"
    return None


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

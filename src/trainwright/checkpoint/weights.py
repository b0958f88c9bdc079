"""Model weights in a checkpoint folder: safetensors (tied weights stored once, sharded above a size),
transformers' `save_pretrained`, and loading either (or `pytorch_model.bin`, weights-only) back.

* `save_model_weights(model, directory, *, max_shard_size="5GB", state_dict=None, is_main_process=True)`:
  a PEFT model is saved as its adapter (`adapters.py`); a transformers `PreTrainedModel` goes through `save_pretrained` (so `from_pretrained` reads it); any
  other module is written with safetensors (`{"format": "pt"}` metadata), one name kept per shared
  storage and the other names recorded as aliases, sharded above `max_shard_size` by
  `huggingface_hub.split_torch_state_dict_into_shards` as `save_pretrained` shards (the same
  `model-0000i-of-0000n.safetensors` files, byte for byte, and `model.safetensors.index.json`); each
  file is fsynced and its metadata sorted, so a save from a snapshot gives the same bytes.
* `load_model_weights(model, directory, strict=True) -> WeightsLoadResult`: reads what
  `save_model_weights` or transformers wrote (a PEFT model: its adapters) (`model.safetensors`, its sharded index, or
  `pytorch_model.bin` through `torch.load(weights_only=True)`); keys and shapes are checked before any
  weight is copied, and in a folder with a manifest (`checkpoint_complete.json`) only the files it
  lists are read.
* `check_load_result(model, result)`: a subclass's own `load_state_dict(strict=False)` result, judged as
  `strict=True` would (tied keys the model leaves out of its saves are tied again).
* `safetensors_problem(path)`: a cheap check (header against size) before a resume loads anything.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import struct
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from trainwright.checkpoint import adapters
from trainwright.checkpoint.files import (
    PT_WEIGHTS_INDEX_NAME,
    PT_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    CheckpointFileNotFoundError,
    file_missing,
    honour_umask,
    make_durable,
    read_json,
    safe_torch_load,
    write_json,
    writing_file,
)
from trainwright.checkpoint.manifest import check_listed
from trainwright.core.modules import is_peft_model, unwrap_model
from trainwright.core.units import parse_size

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Safetensors metadata key (and index metadata key) holding {alias: kept_name} for shared tensors.
ALIASES_KEY = "trainwright_aliases"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
WEIGHTS_PATTERN = "model{suffix}.safetensors"  # huggingface_hub's filename_pattern for WEIGHTS_NAME


class WeightsLoadResult(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


def _preview(keys: Iterable[str], limit: int = 10) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)})"


# -- saving ----------------------------------------------------------------------------------


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict `save_model_weights(model, ...)` writes from when given none (of the unwrapped
    model; of a PEFT model, the part its adapters are saved from)."""
    if is_peft_model(model):
        return adapters.staged_state_dict(model)
    return unwrap_model(model).state_dict()


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


def _fills_storage(t: torch.Tensor) -> bool:
    return (
        t.is_contiguous()
        and t.storage_offset() == 0
        and t.numel() * t.element_size() == t.untyped_storage().nbytes()
    )


def _split_shared(state_dict: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors safetensors can store, each on a storage of its own that it fills, and {alias: kept_name}
    for names that view the very same memory (tied weights)."""
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
        shared = False
        if key is not None:
            if key in views:
                aliases[name] = views[key]
                continue
            shared = key[:2] in storages
            views[key] = name
            storages.add(key[:2])
        t = t.detach()
        if t.device.type != "meta" and (shared or not _fills_storage(t)):
            # Another view of memory an entry uses (a slice of a fused weight), or a part of a larger
            # storage: safetensors refuses shared storage, and the shard plan sizes a tensor by its
            # storage, so this one is stored as a compact copy of its own.
            t = t.clone(memory_format=torch.contiguous_format)
        tensors[name] = t
    return tensors, aliases


def _remove_stale_weights(directory: str, keep: set[str]) -> None:
    for entry in os.listdir(directory):
        if entry in keep:
            continue
        if entry in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME) or _SHARD_RE.match(entry):
            os.unlink(os.path.join(directory, entry))


def _sort_metadata(path: str) -> None:
    """Rewrite a safetensors header with its `__metadata__` keys sorted, in place and at the same length.

    safetensors writes the metadata from a hash map, in an order that changes from call to call, so the
    same tensors would give different bytes (and checksums) each save."""
    with open(path, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        meta = header.get("__metadata__")
        if not isinstance(meta, dict) or len(meta) < 2:
            return
        header["__metadata__"] = dict(sorted(meta.items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > size:  # never: the same content; a header that can't be rewritten stays as it is
            return
        f.seek(8)
        f.write(text.ljust(size, b" "))


def _save_state_dict(
    state_dict: Mapping[str, Any], directory: str, max_bytes: int, parameters: int
) -> list[str]:
    tensors, aliases = _split_shared(state_dict)
    # huggingface_hub's plan, the one transformers' save_pretrained follows: shards filled in key
    # order, a tensor above the limit alone in its shard, `model-0000i-of-0000n.safetensors` names.
    plan = split_torch_state_dict_into_shards(
        tensors, filename_pattern=WEIGHTS_PATTERN, max_shard_size=max_bytes
    )
    shards = plan.filename_to_tensors or {WEIGHTS_NAME: []}  # no tensors: one empty file
    metadata = {"format": "pt"}
    if aliases and not plan.is_sharded:
        metadata[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    for filename, keys in shards.items():
        path = os.path.join(directory, filename)
        with writing_file(path):
            save_file({k: tensors[k] for k in keys}, path, metadata=metadata)
            _sort_metadata(path)
            honour_umask(path)  # safetensors writes through a temporary file of mode 0600
        make_durable(path)
    written = list(shards)
    if plan.is_sharded:
        # as save_pretrained: the model's parameters (each shared one once) and the bytes stored
        index_meta: dict[str, Any] = {"total_parameters": parameters, **plan.metadata}
        if aliases:
            index_meta[ALIASES_KEY] = aliases
        index = {"metadata": index_meta, "weight_map": plan.tensor_to_filename}
        write_json(os.path.join(directory, WEIGHTS_INDEX_NAME), index)
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
    model = unwrap_model(model)
    if is_peft_model(model):  # its adapter, as transformers saves a PEFT model
        adapters.save_adapters(model, directory, state_dict=state_dict, is_main_process=is_main_process)
        return
    if _is_pretrained_model(model):
        kwargs: dict[str, Any] = {"is_main_process": is_main_process, "state_dict": state_dict}
        if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
            kwargs["safe_serialization"] = True  # transformers v4; v5 always writes safetensors
        from trainwright.core.third_party import deepspeed_left_unimported, shard_progress_bar_hidden

        # accelerate would import deepspeed (seconds, a warning) to unwrap; one bar per save is noise
        with deepspeed_left_unimported(), shard_progress_bar_hidden():
            model.save_pretrained(directory, max_shard_size=max_bytes, **kwargs)
        if is_main_process:  # its safetensors files come out 0600 (written through a temporary file)
            for entry in os.listdir(directory):
                if entry.endswith(".safetensors"):
                    honour_umask(os.path.join(directory, entry))
        return
    if not is_main_process:
        return
    os.makedirs(directory, exist_ok=True)
    state = model.state_dict() if state_dict is None else state_dict
    _save_state_dict(state, directory, max_bytes, sum(p.numel() for p in model.parameters()))


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
            raise file_missing(path)
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
    # where the folder has a manifest, only the files it lists are read (an index or shard added
    # later would otherwise take precedence unchecked)
    if os.path.isfile(join(directory, WEIGHTS_INDEX_NAME)):
        check_listed(directory, [join(directory, WEIGHTS_INDEX_NAME)])
        files, index = _shard_files(directory, WEIGHTS_INDEX_NAME)
        check_listed(directory, files)
        aliases = (index.get("metadata") or {}).get(ALIASES_KEY) or {}
        return _WeightFiles("safetensors", files, dict(aliases), join(directory, WEIGHTS_INDEX_NAME))
    if os.path.isfile(join(directory, WEIGHTS_NAME)):
        path = join(directory, WEIGHTS_NAME)
        check_listed(directory, [path])
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
        except Exception as exc:  # safetensors raises its own error types for damaged headers
            raise CheckpointError(f"could not read {path}: {exc}") from exc
        aliases = json.loads(meta[ALIASES_KEY]) if ALIASES_KEY in meta else {}
        return _WeightFiles("safetensors", [path], aliases, path)
    if os.path.isfile(join(directory, PT_WEIGHTS_INDEX_NAME)):
        check_listed(directory, [join(directory, PT_WEIGHTS_INDEX_NAME)])
        files, _ = _shard_files(directory, PT_WEIGHTS_INDEX_NAME)
        check_listed(directory, files)
        return _WeightFiles("pt", files, {}, join(directory, PT_WEIGHTS_INDEX_NAME))
    if os.path.isfile(join(directory, PT_WEIGHTS_NAME)):
        path = join(directory, PT_WEIGHTS_NAME)
        check_listed(directory, [path])
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


class _Stored(NamedTuple):
    """What a weights folder holds, read before anything is copied."""

    shapes: dict[str, tuple[int, ...]]  # stored name -> shape
    present: set[str]  # the names it provides: stored ones and aliases of stored ones
    alias_of: dict[str, str]  # alias -> stored name
    tensors: dict[str, torch.Tensor]  # a pytorch_model.bin's tensors (already read); {} for safetensors


def _read_stored(found: _WeightFiles) -> _Stored:
    tensors: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for path in found.files:
        if found.kind == "safetensors":
            shapes.update(_safetensors_shapes(path))
            continue
        chunk = safe_torch_load(path)
        if not isinstance(chunk, dict):
            raise CheckpointError(f"{path} holds a {type(chunk).__name__}, expected a state dict")
        tensors.update(chunk)
        shapes.update({k: tuple(v.shape) for k, v in chunk.items()})
    alias_of = {a: kept for a, kept in found.aliases.items() if kept in shapes}
    return _Stored(shapes, set(shapes) | set(alias_of), alias_of, tensors)


def _key_mismatch(own: Mapping[str, torch.Tensor], present: set[str]) -> tuple[list[str], list[str]]:
    """(missing, unexpected) keys. Keys the model ties together share memory: a file that has any one
    of them fills the others (transformers drops tied weights such as `lm_head.weight`)."""
    by_view: dict[tuple, list[str]] = {}
    for k, t in own.items():
        key = _view_key(t)
        if key is not None:
            by_view.setdefault(key, []).append(k)
    tied = {k for names in by_view.values() if not present.isdisjoint(names) for k in names}
    missing = [k for k in own if k not in present and k not in tied]
    return missing, sorted(k for k in present if k not in own)


def _check_shapes(
    model: torch.nn.Module, own: Mapping[str, torch.Tensor], stored: _Stored, where: str
) -> None:
    # A buffer may change shape (a growing memory, a resized cache): the model's own
    # load_state_dict / _load_from_state_dict decides, as upstream lets it; parameters must match.
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    wrong = [
        f"{k}: file {shape} vs model {tuple(own[k].shape)}"
        for k in stored.present
        if k in own
        and k in params
        and (shape := stored.shapes[stored.alias_of.get(k, k)]) != tuple(own[k].shape)
    ]
    if wrong:
        raise CheckpointError(f"{where} has tensors of the wrong shape: {'; '.join(wrong[:10])}")


def _copy_in(model: torch.nn.Module, found: _WeightFiles, stored: _Stored, own: Mapping[str, Any]) -> None:
    """Load the files one at a time (a shard's tensors are freed before the next is read)."""
    chunks: Iterable[dict[str, torch.Tensor]]
    if found.kind == "pt":
        chunks = [stored.tensors]
    else:
        chunks = (load_file(path, device="cpu") for path in found.files)
    for chunk in chunks:
        for alias, kept in stored.alias_of.items():
            if kept in chunk:
                chunk[alias] = chunk[kept]
        try:
            model.load_state_dict({k: v for k, v in chunk.items() if k in own}, strict=False)
        except RuntimeError as exc:  # e.g. a buffer of another shape the model does not resize
            raise CheckpointError(
                f"{found.described} does not load into {type(model).__name__}: {exc}"
            ) from exc


def load_model_weights(
    model: torch.nn.Module, directory: str | os.PathLike, strict: bool = True
) -> WeightsLoadResult:
    """Load weights written by `save_model_weights` (or by transformers) into `model`.

    Aliases recorded at save time are filled in, and a key the file lacks is not missing when the model
    ties it to a key the file has (transformers drops tied weights such as `lm_head.weight`). With
    `strict=True` any missing or unexpected key raises `CheckpointError` before anything is copied; with
    `strict=False` they are returned and warned about. Shape mismatches always raise. Where the folder
    has a manifest, a weight file or index it does not list (added after the checkpoint was written)
    is refused naming it.
    """
    model = unwrap_model(model)
    if is_peft_model(model):  # its adapters, as transformers loads a PEFT model's checkpoint
        adapters.load_adapters(model, os.fspath(directory))
        return WeightsLoadResult([], [])
    found = _find_weight_files(os.fspath(directory))
    own = model.state_dict()
    stored = _read_stored(found)
    missing, unexpected = _key_mismatch(own, stored.present)
    if strict and (missing or unexpected):
        parts = [f"missing keys {_preview(missing)}"] if missing else []
        parts += [f"unexpected keys {_preview(unexpected)}"] if unexpected else []
        raise CheckpointError(f"{found.described} does not match the model: " + "; ".join(parts))
    _check_shapes(model, own, stored, found.described)
    _copy_in(model, found, stored, own)
    if missing or unexpected:
        warnings.warn(
            f"{found.described}: missing keys {_preview(missing)}, unexpected keys {_preview(unexpected)}",
            stacklevel=2,
        )
    return WeightsLoadResult(missing, unexpected)


def check_load_result(model: torch.nn.Module, result: Any) -> None:
    """A subclass's own load (`load_state_dict(..., strict=False)`, GLiNER's `_load_from_checkpoint`)
    judged as `load_model_weights(strict=True)` judges one: the keys the model leaves out of its saves
    (`_keys_to_ignore_on_save`, tied to kept weights) are tied again, as transformers does; any other
    missing or unexpected key raises `CheckpointError` naming them (transformers warns and trains on
    from partly initialised weights)."""
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    ignored = getattr(model, "_keys_to_ignore_on_save", None)
    if missing and ignored and set(missing) == set(ignored):
        model.tie_weights()  # type: ignore[operator]
        missing = []
    if missing or unexpected:
        parts = [f"missing keys {_preview(missing)}"] if missing else []
        parts += [f"unexpected keys {_preview(unexpected)}"] if unexpected else []
        raise CheckpointError(
            f"the checkpoint loaded into {type(model).__name__} does not match it: " + "; ".join(parts)
        )


def safetensors_problem(path: str) -> str | None:
    """Why a safetensors file is unreadable, truncated or has a damaged header (an entry without two
    byte offsets), or None if it looks whole; the message names the file."""
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{name} is truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{name} is truncated (header of {n} bytes, file of {size})"
            header = json.loads(f.read(n))
    except FileNotFoundError:
        return f"{name} is missing"
    except (OSError, ValueError) as exc:
        return f"{name} is corrupt: {exc}"
    if not isinstance(header, dict):
        return f"{name} is corrupt: its header is not a JSON object"
    ends = []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int and o >= 0 for o in offsets)
        ):
            return f"{name} is corrupt: its header's entry {key!r} has no valid 'data_offsets'"
        ends.append(offsets[1])
    end = max(ends, default=0)
    if 8 + n + end != size:
        return f"{name} has {size} bytes, its header describes {8 + n + end}"
    return None

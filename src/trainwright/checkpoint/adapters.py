"""PEFT models in checkpoints and saved models: the adapter, not the whole model, as transformers
saves and loads them.

A `peft.PeftModel` (LoRA, IA3, prompt tuning, `modules_to_save`, several adapters) is written by its
own `save_pretrained` (`adapter_config.json` + `adapter_model.safetensors`, other adapters in folders
of their names), so that `PeftModel.from_pretrained(base, folder)` reads it; a resume and the best
model's reload load it back through `load_adapter`, as transformers does, with the difference that a
checkpoint whose adapter does not fit the model (missing or unexpected adapter weights) is refused
naming the folder instead of loaded in part, and a damaged adapter file is named before PEFT reads it.

* `adapter_weight_files(directory)`, `adapter_problems(directory)`: the adapter files a checkpoint
  holds (at its top, and in folders of the adapters' names), and adapters whose weights are missing.
* `base_fingerprint(model)`, `fingerprint_difference(saved, now)`, `base_model_name(model)`,
  `saved_base_names(directory)`: what a resume compares of the base model an adapter was trained on.

PEFT is imported only when a model is one of its classes (`peft` already imported).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from safetensors import safe_open

from trainwright.checkpoint.files import (
    CheckpointError,
    CheckpointFileNotFoundError,
    honour_umask,
    read_json,
)
from trainwright.checkpoint.manifest import check_listed
from trainwright.core.modules import unwrap_model

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_SAFE_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_WEIGHTS_NAME = "adapter_model.bin"


def save_adapters(
    model: Any,
    directory: str,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    is_main_process: bool = True,
) -> None:
    """`model.save_pretrained(directory)`: every adapter's config and weights (from `state_dict`, the
    model's own names, when given), written readable as the umask says."""
    model = unwrap_model(model)
    model.save_pretrained(directory, state_dict=state_dict, is_main_process=is_main_process)
    if is_main_process:  # safetensors files come out 0600 (written through a temporary file)
        for root, _, names in os.walk(directory):
            for name in names:
                if name.endswith(".safetensors"):
                    honour_umask(os.path.join(root, name))


def staged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What `save_pretrained` reads of the model's state dict: the trainable tensors and those of its
    adapters (by the adapter's name among the key's parts), not the frozen base model, so a
    background save copies the adapter's megabytes, not the base model's gigabytes."""
    model = unwrap_model(model)
    names = set(getattr(model, "peft_config", {}) or {})
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {
        key: value
        for key, value in model.state_dict().items()
        if key in trainable or names.intersection(key.split("."))
    }


def _adapter_folders(directory: str, model: Any) -> Iterator[tuple[str, str]]:
    """(adapter name, folder) of each adapter saved in `directory`: the top-level one as the model's
    active adapter (or "default" beside others in sub-folders), others in folders of their names."""
    subdirs = [
        name
        for name in sorted(os.listdir(directory))
        if os.path.isdir(os.path.join(directory, name))
        and os.path.isfile(os.path.join(directory, name, ADAPTER_CONFIG_NAME))
    ]
    active = _active_adapter(model)
    if _has_weights(directory):
        yield ("default" if subdirs else active), directory
    for name in subdirs:
        yield name, os.path.join(directory, name)


def _active_adapter(model: Any) -> str:
    active = getattr(model, "active_adapters", None) or [getattr(model, "active_adapter", "default")]
    return active[0] if isinstance(active, (list, tuple)) else active


def _has_weights(folder: str) -> bool:
    return any(
        os.path.isfile(os.path.join(folder, n)) for n in (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)
    )


def has_adapter(directory: str) -> bool:
    """Whether `directory` holds a saved adapter (its config and weights)."""
    return os.path.isfile(os.path.join(directory, ADAPTER_CONFIG_NAME)) and _has_weights(directory)


def require_adapter(directory: str) -> None:
    """Refuse a folder without a saved adapter (a PEFT model resumes from its adapter), naming what
    it holds instead."""
    if has_adapter(directory) or any(
        has_adapter(os.path.join(directory, n))
        for n in os.listdir(directory)
        if os.path.isdir(os.path.join(directory, n))
    ):
        return
    full = [
        n
        for n in ("model.safetensors", "model.safetensors.index.json")
        if os.path.isfile(os.path.join(directory, n))
    ]
    hint = f" (it holds {full[0]}: a whole model's weights, not a PEFT adapter)" if full else ""
    raise CheckpointFileNotFoundError(
        f"no adapter in {directory}{hint}: the model is a PEFT model, which is saved and resumed as its "
        f"adapter ({ADAPTER_CONFIG_NAME} + {ADAPTER_SAFE_WEIGHTS_NAME})"
    )


def adapter_folders(directory: str) -> list[str]:
    """The folders of `directory` holding an adapter (its config or weights), relative to it ("" for
    the top): PEFT writes the adapter named "default" at the top and each other one in a folder of
    its name, so a checkpoint of one adapter named otherwise has it in a sub-folder only."""

    def holds(folder: str) -> bool:
        return os.path.isfile(os.path.join(folder, ADAPTER_CONFIG_NAME)) or _has_weights(folder)

    found = [""] if holds(directory) else []
    return found + [
        name
        for name in sorted(os.listdir(directory))
        if os.path.isdir(os.path.join(directory, name)) and holds(os.path.join(directory, name))
    ]


def adapter_weight_files(directory: str) -> list[str]:
    """The adapter weight files in `directory`, relative to it (`name/adapter_model.safetensors` for
    an adapter in a sub-folder)."""
    return [
        os.path.join(rel, name)
        for rel in adapter_folders(directory)
        for name in (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)
        if os.path.isfile(os.path.join(directory, rel, name))
    ]


def adapter_problems(directory: str) -> list[str]:
    """Adapters of `directory` whose weights or config are missing (the other file is there), each
    naming the file a resume would read."""
    problems = []
    for rel in adapter_folders(directory):
        config, weights = os.path.join(rel, ADAPTER_CONFIG_NAME), os.path.join(rel, ADAPTER_SAFE_WEIGHTS_NAME)
        if not _has_weights(os.path.join(directory, rel)):
            problems.append(f"{weights} is missing: the weights of the adapter whose {config} is there")
        elif not os.path.isfile(os.path.join(directory, config)):
            problems.append(f"{config} is missing: the config of the adapter whose weights are there")
    return problems


def _checked_files(directory: str, folder: str) -> None:
    """Refuse links, files the manifest of checkpoint `directory` does not list, and a safetensors
    file whose header does not describe it (truncated, damaged), before PEFT reads them."""
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME):
        path = os.path.join(folder, name)
        if os.path.islink(path):
            raise CheckpointError(f"{path} is a symbolic link: a checkpoint's files must be its own")
        if os.path.isfile(path):
            check_listed(directory, [path])
    path = os.path.join(folder, ADAPTER_SAFE_WEIGHTS_NAME)
    if os.path.isfile(path):
        try:
            with safe_open(path, framework="pt") as f:
                f.keys()
        except Exception as exc:  # safetensors raises its own error types for damaged headers
            raise CheckpointError(f"could not read {path}: {exc}") from exc


def load_adapters(model: Any, directory: str) -> None:
    """Load every adapter saved in `directory` into the PEFT `model` (the active one trainable), as
    transformers resumes and reloads the best model; an adapter whose weights do not match the
    model's is refused naming the folder."""
    model = unwrap_model(model)
    if not os.path.isdir(directory):
        raise CheckpointFileNotFoundError(f"checkpoint folder {directory} does not exist")
    require_adapter(directory)
    found = list(_adapter_folders(directory, model))
    active = _active_adapter(model)
    for _, folder in found:  # every file checked before any adapter loads
        _checked_files(directory, folder)
    for name, folder in found:
        try:
            result = model.load_adapter(folder, name, is_trainable=name == active)
        except (RuntimeError, ValueError, KeyError) as exc:  # shapes or configs that do not fit
            raise CheckpointError(f"the adapter in {folder} does not fit the model: {exc}") from exc
        missing = list(getattr(result, "missing_keys", []) or [])
        # a prompt-learning adapter's weights are loaded by its prompt encoder (strictly), after the
        # model's own load_state_dict has listed them as unexpected
        prompt = getattr(model.peft_config.get(name), "is_prompt_learning", False)
        unexpected = [] if prompt else list(getattr(result, "unexpected_keys", []) or [])
        if missing or unexpected:
            raise CheckpointError(
                f"the adapter {name!r} in {folder} does not match the model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]} (another adapter configuration)"
            )
    if len(found) > 1 and hasattr(model, "set_adapter"):
        model.set_adapter(active)


# -- the base model an adapter was trained on ----------------------------------------------------------------------
# An adapter is a change to one base model's weights: resumed onto another base it trains on, wrong. A
# base's folder may move, so its name is not the base; its frozen weights are. The fingerprint is a few
# values of every frozen parameter (first, a third, two thirds, last, as stored bytes): two distinct
# trained models differ in them, and taking them costs nothing next to a save. Buffers are left out (a
# frozen BatchNorm's running statistics change as it trains), and so is the original of a module PEFT
# trains a copy of (`modules_to_save`: a classifier head initialised anew at each load is not used).
_WRAPPED = "base_layer"  # the part PEFT adds to the names of the tensors of a module it wraps


def base_model_name(model: Any) -> str | None:
    """What PEFT writes as `base_model_name_or_path` for this model's adapters (None: built from a
    config, no name)."""
    model = unwrap_model(model)
    for config in (getattr(model, "peft_config", None) or {}).values():
        if getattr(config, "base_model_name_or_path", None):
            return str(config.base_model_name_or_path)
    base = model.get_base_model() if hasattr(model, "get_base_model") else None
    return (base.__dict__.get("name_or_path") or None) if base is not None else None


def saved_base_names(directory: str) -> dict[str, str]:
    """{adapter_config.json path: its base_model_name_or_path} of each adapter in `directory` that
    names one."""
    names = {}
    for rel in adapter_folders(directory):
        path = os.path.join(directory, rel, ADAPTER_CONFIG_NAME)
        config = read_json(path) if os.path.isfile(path) else None
        name = config.get("base_model_name_or_path") if isinstance(config, dict) else None
        if isinstance(name, str) and name:
            names[path] = name
    return names


def base_fingerprint(model: Any) -> dict[str, str] | None:
    """{parameter name: "dtype:shape:hex of a few values"} of the frozen parameters of the PEFT
    model's base model (names as in the unwrapped base); None where a parameter is not in this process
    whole (meta, DTensor shards, DeepSpeed ZeRO-3) or there is none."""
    model = unwrap_model(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    adapters = set(getattr(model, "peft_config", {}) or {})
    out: dict[str, str] = {}
    for key, param in base.named_parameters():
        parts = key.split(".")
        if param.requires_grad or adapters.intersection(parts) or "original_module" in parts:
            continue
        if param.is_meta or hasattr(param, "device_mesh") or hasattr(param, "ds_id"):
            return None
        flat = param.detach().reshape(-1)
        n = flat.numel()
        picked = flat[sorted({0, n // 3, 2 * n // 3, n - 1})] if n else flat
        raw = picked.cpu().contiguous().view(torch.uint8).numpy().tobytes().hex()
        shape = ",".join(str(d) for d in param.shape)
        out[".".join(p for p in parts if p != _WRAPPED)] = f"{str(param.dtype)[6:]}:{shape}:{raw}"
    return out or None


def _values(entry: str) -> tuple[str, torch.Tensor | None]:
    """(shape, values) of a fingerprint entry."""
    dtype_name, shape, raw = entry.split(":")
    dtype = getattr(torch, dtype_name, None)
    values = (
        torch.frombuffer(bytearray.fromhex(raw), dtype=dtype)
        if isinstance(dtype, torch.dtype) and raw
        else None
    )
    return shape, values


def _same_values(saved: str, now: str) -> bool:
    """The same values, or, where the base was loaded in another floating dtype, the same within the
    precision of the coarser one."""
    if saved == now:
        return True
    (_, a), (_, b) = _values(saved), _values(now)
    if a is None or b is None or a.dtype == b.dtype or not (a.is_floating_point() and b.is_floating_point()):
        return False
    coarse = max(torch.finfo(a.dtype), torch.finfo(b.dtype), key=lambda f: f.eps)
    return torch.allclose(a.double(), b.double(), rtol=coarse.eps, atol=coarse.tiny, equal_nan=True)


def fingerprint_difference(saved: dict[str, str], now: dict[str, str]) -> str | None:
    """How the base model of fingerprint `now` differs from that of `saved` (tensors named), or None
    where they are the same weights."""
    missing, extra = sorted(saved.keys() - now.keys()), sorted(now.keys() - saved.keys())
    if missing:
        return f"the checkpoint's base model has parameters this one lacks ({', '.join(missing[:3])})"
    if extra:
        return f"this base model has parameters the checkpoint's lacks ({', '.join(extra[:3])})"
    shapes = [k for k in sorted(saved) if _values(saved[k])[0] != _values(now[k])[0]]
    if shapes:
        return (
            f"{shapes[0]} has shape [{_values(saved[shapes[0]])[0]}] in the checkpoint's base model, "
            f"[{_values(now[shapes[0]])[0]}] in this one"
        )
    other = [k for k in sorted(saved) if not _same_values(saved[k], now[k])]
    if other:
        return (
            f"{len(other)} of its {len(saved)} frozen parameters hold other values ({', '.join(other[:3])})"
        )
    return None

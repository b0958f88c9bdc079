"""PEFT models in checkpoints and saved models: the adapter, not the whole model, as transformers
saves and loads them.

A `peft.PeftModel` (LoRA, IA3, prompt tuning, `modules_to_save`, several adapters) is written by its
own `save_pretrained` (`adapter_config.json` + `adapter_model.safetensors`, other adapters in folders
of their names), so that `PeftModel.from_pretrained(base, folder)` reads it; a resume and the best
model's reload load it back through `load_adapter`, as transformers does, with the difference that a
checkpoint whose adapter does not fit the model (missing or unexpected adapter weights) is refused
naming the folder instead of loaded in part.

PEFT is imported only when a model is one of its classes (`peft` already imported).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from trainwright.checkpoint.files import CheckpointError, CheckpointFileNotFoundError, honour_umask
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


def _checked_files(folder: str) -> None:
    """Refuse links and files a manifest does not list, before PEFT reads them."""
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME):
        path = os.path.join(folder, name)
        if os.path.islink(path):
            raise CheckpointError(f"{path} is a symbolic link: a checkpoint's files must be its own")
        if os.path.isfile(path):
            check_listed(folder, [path])


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
    for name, folder in found:
        _checked_files(folder)
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

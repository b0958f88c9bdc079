"""The layout of a checkpoint folder: one row per part name, the only table of them.

A checkpoint is a mapping `{name: part}` (see `manager.py`); each name has a row here saying where
the part lives in the folder and what a resume requires of it. The manager writes and reads parts by
these rows, `verify.check_checkpoint_files` checks the files by them, and the resume rules ask which
rows are required. Adding a part to trainwright's checkpoints is its object (a Stateful with
`state_dict()` / `load_state_dict()`, or a folder part with `save(folder)` / `load(folder)`) plus one
row here. A user's part (a callback with a `checkpoint_part` name) declares its own file instead
(`checkpoint_file`, `declared_spec`): the table stays the library's.

Kinds: "torch", "json" and "tensors" are Stateful parts whose state dict is one file (`torch.save`
read back weights-only, JSON, or safetensors: `{"tensors": ..., "metadata": ...}`); "weights" is the model's weights (safetensors, shards, or `pytorch_model.bin`),
"folder" a format of the part's own (FSDP's DCP folders, DeepSpeed's engine checkpoint); both save
and load themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from trainwright.checkpoint.files import (
    BASE_MODEL_NAME,
    BATCH_IN_HAND_NAME,
    DATA_STATE_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    WEIGHTS_NAME,
)


@dataclass(frozen=True)
class PartSpec:
    """Where part `name` lives and what a resume requires of it.

    `file`: the file of a Stateful part (per process when `every_process`: `rng_state_<rank>.pth`
    with several processes, `process_file`),
    or what shows that a weights/folder part is present. `required`: a resume refuses a checkpoint
    without it. `optimizer_state`: part of the training state that `save_only_model` leaves out and a
    weights-only resume does not read.
    """

    file: str
    kind: str  # "torch" | "json" | "tensors" (safetensors) | "weights" | "folder"
    required: bool = False
    every_process: bool = False
    optimizer_state: bool = False

    @property
    def stateful(self) -> bool:
        """Whether the part is a state dict in one file (else it saves and loads itself)."""
        return self.kind in ("torch", "json", "tensors")


# Restoring loads parts in this order: weights and optimizer before the schedule that drives it, the
# trainer state before the data position that may be rebuilt from its global_step (and the batch in
# hand, kept only where that position is), RNG state last.
PARTS: dict[str, PartSpec] = {
    "model": PartSpec(WEIGHTS_NAME, "weights", required=True),
    "base_model": PartSpec(BASE_MODEL_NAME, "json"),  # a PEFT model's: the base its adapters were trained on
    "sharded": PartSpec("pytorch_model_fsdp_0", "folder"),  # FSDP2: model (and optimizer) in DCP
    "deepspeed": PartSpec("deepspeed", "folder", optimizer_state=True),  # DeepSpeed's engine checkpoint
    "optimizer": PartSpec(OPTIMIZER_NAME, "torch", required=True, optimizer_state=True),
    "scheduler": PartSpec(SCHEDULER_NAME, "torch", required=True, optimizer_state=True),
    "scaler": PartSpec(SCALER_NAME, "torch", optimizer_state=True),
    "trainer_state": PartSpec(TRAINER_STATE_NAME, "json", required=True),
    "data_state": PartSpec(DATA_STATE_NAME, "json"),
    # the training batch fetched ahead of the next step (data/look_ahead.py), where it can be stored
    "batch_in_hand": PartSpec(BATCH_IN_HAND_NAME, "tensors", every_process=True, optimizer_state=True),
    "rng": PartSpec(RNG_STATE_NAME, "torch", every_process=True, optimizer_state=True),
}


def process_file(folder: str, row: PartSpec, rank: int, world_size: int) -> str:
    """The file of part `row` in `folder` for process `rank`: its name with several processes as
    `<stem>_<rank><suffix>` where every process writes its own (`rng_state_1.pth`), else its name."""
    if not row.every_process or world_size <= 1:
        return os.path.join(folder, row.file)
    stem, suffix = os.path.splitext(row.file)
    return os.path.join(folder, f"{stem}_{rank}{suffix}")


def spec(name: str) -> PartSpec:
    """The row of part `name`; an unknown name is an error naming the table."""
    try:
        return PARTS[name]
    except KeyError:
        raise KeyError(
            f"checkpoint part {name!r} has no row in trainwright.checkpoint.layout.PARTS "
            f"(known: {sorted(PARTS)}) and declares no file: give the part a `checkpoint_file` "
            "(e.g. 'ema.pt' for torch.save, 'ema.json' for JSON)"
        ) from None


def declared_spec(name: str, part: Any) -> PartSpec | None:
    """The row a part declares itself (`checkpoint_file`: a Stateful part in one file, JSON when it
    ends in .json, else `torch.save`), or None; a library part's name is refused."""
    file = getattr(part, "checkpoint_file", None)
    if file is None:
        return None
    if name in PARTS:
        raise ValueError(
            f"checkpoint part {name!r} of {type(part).__name__} declares checkpoint_file={file!r}, but "
            f"{name!r} is trainwright's own part: name the part otherwise."
        )
    if not isinstance(file, str) or not file or os.path.basename(file) != file or file.startswith("."):
        raise ValueError(
            f"checkpoint part {name!r}: checkpoint_file={file!r} must be a plain file name in the "
            "checkpoint folder (no folder, not hidden)."
        )
    return PartSpec(file, "json" if file.endswith(".json") else "torch")

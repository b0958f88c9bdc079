"""A checkpoint is a mapping of parts, `{name: part}`, written into one folder atomically and read back.

The caller (the Trainer) says what a checkpoint holds by the mapping it hands over; this module says
how each name is stored, so the layout of docs/design.md lives in one table (`FILES`), as torchtitan's
`CheckpointManager(states)` does for its states:

* a **Stateful** part (`state_dict()` / `load_state_dict()`) under a name of `FILES` is written from
  its state dict: `optimizer.pt`, `scheduler.pt`, `scaler.pt` (`torch.save`, read back weights-only),
  `rng_state.pth` / `rng_state_<rank>.pth` (every process its own), `data_state.json`,
  `trainer_state.json`;
* a **FolderPart** (`save(folder)` / `load(folder)`) writes files of its own format: the model's
  weights (safetensors / `save_pretrained`), FSDP's DCP folders, DeepSpeed's engine checkpoint. It is
  called on every process and decides itself who writes.

`save` takes one snapshot of the Stateful parts (`{name: part.state_dict()}`) before anything is
written, then writes the snapshot and the folder parts inside `write_checkpoint`'s hidden folder
(renamed into place when every process is done) and rotates old checkpoints. The snapshot is the
seam for an asynchronous writer: everything after it reads only the snapshot and the folder parts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from trainwright.checkpoint.files import (
    DATA_STATE_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    read_json,
    safe_torch_load,
    save_torch_state,
    write_json,
)
from trainwright.checkpoint.folder import rotate_checkpoints, write_checkpoint
from trainwright.checkpoint.rng import load_rng_state, rng_state_file


@runtime_checkable
class Stateful(Protocol):
    """A part whose state is a state dict (torch's optimizer, scheduler and grad scaler are ones)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


@runtime_checkable
class FolderPart(Protocol):
    """A part stored in a format of its own, written and read by itself (called on every process)."""

    def save(self, folder: str) -> Any: ...

    def load(self, folder: str) -> Any: ...


class Processes(Protocol):
    """What the manager needs of the runtime: this process's place, and the collectives of
    `write_checkpoint`."""

    rank: int
    world_size: int

    def barrier(self) -> None: ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...


@dataclass(frozen=True)
class PartFile:
    """Where a Stateful part is stored: one file, torch (weights-only) or JSON, written by the main
    process or by every process (then named per rank)."""

    name: str
    kind: str  # "torch" | "json"
    every_process: bool = False


FILES: dict[str, PartFile] = {
    "optimizer": PartFile(OPTIMIZER_NAME, "torch"),
    "scheduler": PartFile(SCHEDULER_NAME, "torch"),
    "scaler": PartFile(SCALER_NAME, "torch"),
    "rng": PartFile(RNG_STATE_NAME, "torch", every_process=True),
    "data_state": PartFile(DATA_STATE_NAME, "json"),
    "trainer_state": PartFile(TRAINER_STATE_NAME, "json"),
}


class CheckpointManager:
    """Writes and reads checkpoint mappings for one process; `main` is whether this process writes
    the files that exist once per checkpoint (the main process, or each node's with save_on_each_node)."""

    def __init__(self, runtime: Processes, *, main: bool) -> None:
        self.runtime, self.main = runtime, main

    def path(self, folder: str, name: str) -> str:
        """The file of Stateful part `name` in a checkpoint folder (this process's, for per-process files)."""
        spec = FILES[name]
        if spec.every_process:
            return rng_state_file(folder, self.runtime.rank, self.runtime.world_size)
        return os.path.join(folder, spec.name)

    def has(self, folder: str, name: str) -> bool:
        return os.path.isfile(self.path(folder, name))

    # -- writing ---------------------------------------------------------------------------------
    def snapshot(self, parts: Mapping[str, Any]) -> dict[str, Any]:
        """`{name: state dict}` of the Stateful parts this process writes."""
        return {
            name: part.state_dict()
            for name, part in parts.items()
            if name in FILES and (self.main or FILES[name].every_process)
        }

    def save(
        self,
        run_dir: str,
        name: str,
        parts: Mapping[str, Any],
        *,
        save_total_limit: int | None = None,
        best_checkpoint: str | None = None,
    ) -> str:
        """Write `parts` as `run_dir/name` atomically (every process calls it), then rotate the run's
        checkpoints to `save_total_limit`, never deleting `best_checkpoint`; returns the folder."""
        unknown = [n for n, p in parts.items() if n not in FILES and not isinstance(p, FolderPart)]
        if unknown:
            raise TypeError(
                f"checkpoint parts {unknown}: not a file of FILES and no save(folder)/load(folder)"
            )
        states = self.snapshot(parts)

        def write(tmp: str) -> None:
            for part_name, part in parts.items():
                if part_name not in FILES:
                    part.save(tmp)
                elif part_name in states:
                    self._write(tmp, part_name, states[part_name])

        path = write_checkpoint(run_dir, name, write, runtime=self.runtime)
        if self.main and save_total_limit is not None:
            rotate_checkpoints(run_dir, save_total_limit, best_model_checkpoint=best_checkpoint)
        self.runtime.barrier()
        return path

    def _write(self, folder: str, name: str, state: Any) -> None:
        path = self.path(folder, name)
        if FILES[name].kind == "json":
            write_json(path, state)
        else:
            save_torch_state(state, path)

    # -- reading ---------------------------------------------------------------------------------
    def read(self, folder: str, name: str) -> Any:
        """The saved state of Stateful part `name` (a `CheckpointError` names a missing or damaged file)."""
        path = self.path(folder, name)
        return read_json(path) if FILES[name].kind == "json" else safe_torch_load(path)

    def load(self, folder: str, parts: Mapping[str, Any]) -> None:
        """Put each part's saved state back. RNG state that is missing warns (deleting the file is how
        a resume opts out of it); any other missing file is an error."""
        for name, part in parts.items():
            if name not in FILES:
                part.load(folder)
            elif name == "rng":  # transformers' RNG files too; a damaged one is an error naming it
                load_rng_state(
                    folder, self.runtime.rank, self.runtime.world_size, restore=part.load_state_dict
                )
            else:
                part.load_state_dict(self.read(folder, name))

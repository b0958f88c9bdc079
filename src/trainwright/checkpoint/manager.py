"""A checkpoint is a mapping of parts, `{name: part}`, written into one folder atomically and read back.

The caller (the Trainer's checkpointer) says what a checkpoint holds by the mapping it hands over;
where each name is stored is the row of `layout.PARTS`, as torchtitan's `CheckpointManager(states)`
does for its states, or the file a part declares itself (`checkpoint_file`: a user's part, e.g. a
callback holding an EMA of the weights, never touches the library's table):

* a **Stateful** part (`state_dict()` / `load_state_dict()`) of a "torch", "json" or "tensors" row is
  written from its state dict: `optimizer.pt`, `scheduler.pt`, `scaler.pt` (`torch.save`, read back
  weights-only), `rng_state.pth` / `rng_state_<rank>.pth` (every process its own), `data_state.json`,
  `trainer_state.json`, `batch_in_hand.safetensors` (safetensors);
* a **FolderPart** (`save(folder)` / `load(folder)`) writes files of its own format: the model's
  weights (safetensors / `save_pretrained`), FSDP's DCP folders, DeepSpeed's engine checkpoint. It is
  called on every process and decides itself who writes.

`save` takes one snapshot of the Stateful parts (`{name: part.state_dict()}`) before anything is
written, then writes the snapshot and the folder parts inside `write_checkpoint`'s hidden folder
(renamed into place when every process is done) and rotates old checkpoints. The snapshot is the
seam for an asynchronous writer: everything after it reads only the snapshot and the folder parts.

`load` restores the same kind of mapping: every part's own `check(saved, folder)` runs first (a
resume that does not fit is refused before anything is loaded), then each part loads, in the table's
order; a part whose file is absent is skipped, or told so (`load_absent(folder)`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from trainwright.checkpoint.files import (
    load_tensors_state,
    read_json,
    safe_torch_load,
    save_tensors_state,
    save_torch_state,
    write_json,
)
from trainwright.checkpoint.folder import rotate_checkpoints, write_checkpoint
from trainwright.checkpoint.layout import PARTS, PartSpec, declared_spec, process_file, spec
from trainwright.checkpoint.rng import load_rng_state


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


class CheckpointManager:
    """Writes and reads checkpoint mappings for one process; `main` is whether this process writes
    the files that exist once per checkpoint (the main process, or each node's with save_on_each_node)."""

    def __init__(self, runtime: Processes, *, main: bool) -> None:
        self.runtime, self.main = runtime, main
        self.declared: dict[str, PartSpec] = {}  # rows the parts handed over declared themselves

    def learn(self, parts: Mapping[str, Any]) -> None:
        """Take the rows that parts of a mapping declare (`layout.declared_spec`)."""
        for name, part in parts.items():
            row = declared_spec(name, part)
            if row is not None:
                self.declared[name] = row

    def row(self, name: str) -> PartSpec:
        """Where part `name` is stored: its declared row, else the table's."""
        return self.declared.get(name) or spec(name)

    def is_stateful(self, name: str) -> bool:
        """Whether part `name` is a state dict in one file (else the part saves and loads itself)."""
        return self.row(name).stateful

    def path(self, folder: str, name: str) -> str:
        """The file of part `name` in a checkpoint folder (this process's, for per-process files)."""
        return process_file(folder, self.row(name), self.runtime.rank, self.runtime.world_size)

    def has(self, folder: str, name: str) -> bool:
        return os.path.exists(self.path(folder, name))

    # -- writing ---------------------------------------------------------------------------------
    def snapshot(self, parts: Mapping[str, Any]) -> dict[str, Any]:
        """`{name: state dict}` of the Stateful parts this process writes."""
        self.learn(parts)
        return {
            name: part.state_dict()
            for name, part in parts.items()
            if self.is_stateful(name) and (self.main or self.row(name).every_process)
        }

    def save(
        self,
        run_dir: str,
        name: str,
        parts: Mapping[str, Any],
        *,
        save_total_limit: int | None = None,
        best_checkpoint: str | None = None,
        keep: Iterable[str] = (),
        exclude: Iterable[str] = (),
    ) -> str:
        """Write `parts` as `run_dir/name` atomically (every process calls it), then rotate the run's
        checkpoints to `save_total_limit`, never deleting `best_checkpoint`, the new one or `keep`, and
        leaving `exclude` (another run's) alone; returns the folder."""
        states = self.snapshot(parts)

        def write(tmp: str) -> None:
            for part_name, part in parts.items():
                if not self.is_stateful(part_name):
                    part.save(tmp)
                elif part_name in states:
                    self.write_state(tmp, part_name, states[part_name])

        path = write_checkpoint(run_dir, name, write, runtime=self.runtime)
        if self.main and save_total_limit is not None:
            rotate_checkpoints(
                run_dir, save_total_limit, best_checkpoint, keep=[path, *keep], exclude=exclude
            )
        self.runtime.barrier()
        return path

    def write_state(self, folder: str, name: str, state: Any) -> None:
        """One Stateful part's file from its state dict (the writer thread calls it too)."""
        path, kind = self.path(folder, name), self.row(name).kind
        if kind == "json":
            write_json(path, state)
        elif kind == "tensors":
            save_tensors_state(state, path)
        else:
            save_torch_state(state, path)

    # -- reading ---------------------------------------------------------------------------------
    def read(self, folder: str, name: str) -> Any:
        """The saved state of Stateful part `name` (a `CheckpointError` names a missing or damaged file)."""
        path, kind = self.path(folder, name), self.row(name).kind
        if kind == "tensors":
            return load_tensors_state(path)
        return read_json(path) if kind == "json" else safe_torch_load(path)

    def load(self, folder: str, parts: Mapping[str, Any]) -> None:
        """Put each part's saved state back: every part's `check(saved, folder)` first, then each
        part's load in the table's order. A Stateful part whose file is absent is skipped (or its
        `load_absent(folder)` runs); a folder part loads itself. RNG state that is missing warns
        (deleting the file is how a resume opts out of it)."""
        self.learn(parts)
        saved = {
            name: self.read(folder, name)
            for name, part in parts.items()
            if self.is_stateful(name) and name != "rng" and not _loads_itself(part) and self.has(folder, name)
        }
        for name, part in parts.items():
            check = getattr(part, "check", None)
            if callable(check):
                check(saved.get(name), folder)
        for name in sorted(parts, key=_table_order):
            self._load_one(folder, name, parts[name], saved)

    def _load_one(self, folder: str, name: str, part: Any, saved: dict[str, Any]) -> None:
        if _loads_itself(part):
            part.load(folder)
        elif name == "rng":  # transformers' RNG files too; a damaged one is an error naming it
            load_rng_state(folder, self.runtime.rank, self.runtime.world_size, restore=part.load_state_dict)
        elif name in saved:
            part.load_state_dict(saved[name])
        elif callable(getattr(part, "load_absent", None)):
            part.load_absent(folder)


def _loads_itself(part: Any) -> bool:
    """A part with `load(folder)` reads its own files when restored (a Stateful part too, e.g. RNG
    state restored through the Trainer's overridable `_load_rng_state`)."""
    return callable(getattr(part, "load", None))


_ORDER = {name: i for i, name in enumerate(PARTS)}


def _table_order(name: str) -> int:
    return _ORDER.get(name, len(_ORDER))

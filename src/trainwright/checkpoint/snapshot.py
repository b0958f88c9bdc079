"""Consistent host copies of checkpoint state, for writes that happen while training goes on.

An asynchronous save copies everything a checkpoint holds at the save step and writes the copy in
the background. `SnapshotBuffers.take(state)` walks a state mapping (nested dicts, lists, tuples of
tensors and plain data, e.g. `{name: part.state_dict()}`) and returns a `Snapshot` whose `.state`
has the same structure:

* every tensor's storage is copied into a host buffer that the buffers object keeps and reuses at the
  next snapshot (keyed by the path where the storage was first met; reallocated only when its byte
  size or placement changes), so steady-state saves allocate nothing;
* the copy keeps the sharing structure exactly: tensors viewing one storage (tied weights, slices of
  a fused weight) view one buffer at the same offsets, the same tensor object met twice is one
  object in the copy, containers met twice are one container. Serializers therefore write the same
  bytes from the copy as from the live state (`torch.save` writes shared storages once and whole;
  safetensors aliases identical views);
* on CUDA the buffers are pinned and the copies are `non_blocking` on the current stream, followed
  by a CUDA event: the training thread does not wait for the copy, the writer calls
  `Snapshot.wait()` before reading (later kernels on the same stream run after the copy, so the
  copy sees the values of the save step);
* a `DTensor` (FSDP2's sharded state, written by torch.distributed.checkpoint) has its local shard
  copied like any tensor and keeps its sharding spec;
* everything else (numbers, strings, other objects) is deep-copied.

Host memory is bounded by one checkpoint's worth: the buffers of one snapshot, reported as
`Snapshot.nbytes` / `SnapshotBuffers.nbytes`. A `SnapshotBuffers` lends its buffers to one snapshot
at a time: `take` raises while the previous snapshot is not `release()`d (a write still reading it).
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch

__all__ = ["Snapshot", "SnapshotBuffers", "SnapshotError"]

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def _is_dtensor(t: torch.Tensor) -> bool:
    # by name: importing torch.distributed.tensor costs ~0.3 s, and only a run that made one has one
    return type(t).__name__ == "DTensor" and type(t).__module__.startswith("torch.distributed.tensor")


class SnapshotError(TypeError):
    """A value in the state cannot be snapshotted; the message names its path."""


def _path_str(path: tuple[Any, ...]) -> str:
    return "state" + "".join(f"[{p!r}]" for p in path)


class Snapshot:
    """A host copy of a state mapping. `state` is valid after `wait()` and until `release()`."""

    def __init__(self, owner: SnapshotBuffers, state: Any, nbytes: int, tensors: int, events: list[Any]):
        self.state = state
        self.nbytes = nbytes  # bytes of the host buffers this snapshot's tensors view
        self.tensors = tensors  # tensors in the state (views of one storage counted each)
        self._events = events
        self._owner: SnapshotBuffers | None = owner

    def wait(self) -> None:
        """Block until the device-to-host copies are done (a no-op for CPU state). Call it in the
        thread that reads `state`, before reading."""
        for event in self._events:
            event.synchronize()
        self._events = []

    def release(self) -> None:
        """Give the buffers back for the next snapshot; `state` must not be read after this."""
        if self._owner is not None:
            self._owner._released(self)
            self._owner = None

    @property
    def released(self) -> bool:
        return self._owner is None


class SnapshotBuffers:
    """Reused host buffers for successive snapshots of the same (or similar) state.

    `pin_memory`: pin the buffers of CUDA tensors (default: whenever CUDA is available). Pinned
    buffers make device-to-host copies asynchronous; CPU tensors are copied into plain buffers.
    """

    def __init__(self, *, pin_memory: bool | None = None) -> None:
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._buffers: dict[str, torch.Tensor] = {}
        self._lent: Snapshot | None = None
        self._lock = threading.Lock()
        self.allocations = 0  # buffers allocated so far (a steady state allocates none)

    @property
    def nbytes(self) -> int:
        """Host bytes the buffers hold now."""
        return sum(b.numel() for b in self._buffers.values())

    def clear(self) -> None:
        """Free the buffers (none may be lent)."""
        with self._lock:
            if self._lent is not None:
                raise RuntimeError(
                    "SnapshotBuffers.clear: a snapshot still uses the buffers; release it first"
                )
            self._buffers.clear()

    def _released(self, snapshot: Snapshot) -> None:
        with self._lock:
            if self._lent is snapshot:
                self._lent = None

    def take(self, state: Any) -> Snapshot:
        """Copy `state` into the buffers; returns the snapshot (release it when written)."""
        with self._lock:
            if self._lent is not None:
                raise RuntimeError(
                    "SnapshotBuffers.take: the previous snapshot has not been released (its write is still "
                    "reading the buffers); wait for that write first"
                )
            walker = _Walker(self)
            copied = walker.copy(state, ())
            # Buffers of storages that are gone would otherwise stay allocated: one checkpoint's worth.
            for key in set(self._buffers) - walker.used:
                del self._buffers[key]
            events = []
            for device in walker.cuda_devices:
                with torch.cuda.device(device):
                    event = torch.cuda.Event()
                    event.record()
                    events.append(event)
            snapshot = Snapshot(self, copied, walker.nbytes, walker.tensors, events)
            self._lent = snapshot
            return snapshot

    def _buffer(self, key: str, nbytes: int, pinned: bool) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.numel() != nbytes or buf.is_pinned() != pinned:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
            self._buffers[key] = buf
            self.allocations += 1
        return buf


class _Walker:
    """One snapshot's walk over a state: copies, with memo tables that keep its sharing structure."""

    def __init__(self, owner: SnapshotBuffers) -> None:
        self.owner = owner
        self.memo: dict[int, Any] = {}  # id(original object) -> its copy
        self.keep: list[Any] = []  # originals in `memo`, alive until the walk ends (ids stay unique)
        self.storages: dict[tuple[torch.device, int], torch.Tensor] = {}  # storage -> its host buffer
        self.used: set[str] = set()
        self.cuda_devices: set[torch.device] = set()
        self.nbytes = 0
        self.tensors = 0

    def copy(self, obj: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(obj, _IMMUTABLE):
            return obj
        done = self.memo.get(id(obj))
        if done is not None:
            return done
        out: Any
        if isinstance(obj, torch.Tensor):
            out = self._tensor(obj, path)
        elif isinstance(obj, dict):
            if type(obj) is dict:
                out = {}
            else:  # OrderedDict and other dict subclasses keep their type (it is part of what pickles)
                out = copy.copy(obj)
                out.clear()
            self._remember(obj, out)
            for key, value in obj.items():
                out[key] = self.copy(value, (*path, key))
            return out
        elif isinstance(obj, list):
            out = []
            self._remember(obj, out)
            out.extend(self.copy(v, (*path, i)) for i, v in enumerate(obj))
            return out
        elif isinstance(obj, tuple):
            items = [self.copy(v, (*path, i)) for i, v in enumerate(obj)]
            out = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        elif isinstance(obj, (set, frozenset)):
            out = type(obj)(self.copy(v, (*path, i)) for i, v in enumerate(obj))
        else:
            out = copy.deepcopy(obj)
        self._remember(obj, out)
        return out

    def _remember(self, original: Any, copied: Any) -> None:
        self.memo[id(original)] = copied
        self.keep.append(original)

    def _tensor(self, t: torch.Tensor, path: tuple[Any, ...]) -> torch.Tensor:
        if _is_dtensor(t):
            # FSDP2 / DCP state: this rank's shard is copied; the sharding spec (mesh, placements,
            # global shape) is shared, as torch.distributed.checkpoint's own staging does.
            from torch.distributed.tensor import DTensor

            local = self._tensor(t._local_tensor, (*path, "<local>"))  # type: ignore[attr-defined]
            self.tensors -= 1  # counted once, as the DTensor
            return DTensor(local, t._spec, requires_grad=t.requires_grad)  # type: ignore[attr-defined]
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            raise SnapshotError(
                f"cannot snapshot {_path_str(path)}: a {type(t).__name__} with layout {t.layout}; only dense "
                "tensors and DTensors are copied"
            )
        self.tensors += 1
        if t.device.type == "meta":
            return t.detach().clone()
        storage = t.untyped_storage()
        key = (t.device, storage.data_ptr())
        buf = self.storages.get(key) if storage.data_ptr() != 0 else None
        if buf is None:
            name = _path_str(path)
            cuda = t.device.type == "cuda"
            buf = self.owner._buffer(name, storage.nbytes(), pinned=cuda and self.owner.pin_memory)
            self.used.add(name)
            self.nbytes += buf.numel()
            if storage.nbytes():
                source = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
                # non_blocking only helps into pinned memory; elsewhere it is an ordinary copy
                buf.copy_(source, non_blocking=cuda and buf.is_pinned())
                if cuda:
                    self.cuda_devices.add(t.device)
            if storage.data_ptr() != 0:
                self.storages[key] = buf
        view = torch.empty(0, dtype=t.dtype).set_(
            buf.untyped_storage(), t.storage_offset(), t.size(), t.stride()
        )
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(view, requires_grad=t.requires_grad)
        if t.requires_grad:
            view.requires_grad_(True)
        return view

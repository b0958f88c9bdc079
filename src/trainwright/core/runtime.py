"""The one place that knows about processes and devices.

A single CPU process is world_size 1 and goes through the same code as a torchrun job: every
collective below is a no-op (or an identity) when there is one process.

Under torchrun (or any launcher that sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT) the first
`get_runtime()` starts the process group (nccl on CUDA, gloo on CPU, or `ddp_backend`) with
`ddp_timeout`, so a collective that a dead or stuck peer never joins fails after that long instead of
hanging. The group is torn down at interpreter exit, and an uncaught exception is written to
torchelastic's error file so that torchrun's failure summary names the rank that failed and why.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


@dataclass(frozen=True)
class Layout:
    """An N-D parallel layout of the processes (`parallelism_config`): its DeviceMesh and sizes, and
    the data-parallel view of it. Processes that share a batch (tensor- and context-parallel peers)
    are one data-parallel rank; `data_group` joins this process to its peers at the same position in
    the other data-parallel ranks, and `data_leaders[d]` is the first process of data rank d.
    `shard_mesh` is the mesh FSDP2 shards over ("dp_shard", or "dp_shard_cp" with context
    parallelism; with the replicas as HSDP's outer dimension)."""

    mesh: Any
    sizes: dict[str, int]
    data_rank: int
    data_world_size: int
    data_group: Any
    data_leaders: tuple[int, ...]
    shard_mesh: Any = None


@dataclass
class Runtime:
    """Device, rank and collectives of this process."""

    device: torch.device
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: str | None = None
    timeout_s: int = 1800
    _owns_group: bool = field(default=False, repr=False)
    _cpu_group: Any = field(default=None, repr=False)
    layout: Layout | None = field(default=None, repr=False)  # set by trainwright.distributed.parallelism

    # -- identity ---------------------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_rank == 0

    @property
    def node_rank(self) -> int:
        return self.rank // max(self.local_world_size, 1)

    @property
    def data_rank(self) -> int:
        """Which batch this process reads: its rank among the data-parallel ranks."""
        return self.rank if self.layout is None else self.layout.data_rank

    @property
    def data_world_size(self) -> int:
        """Processes that read different batches (all of them without an N-D layout)."""
        return self.world_size if self.layout is None else self.layout.data_world_size

    @property
    def gradient_average_size(self) -> int:
        """Processes whose gradients DDP / FSDP average (a mean, where a step's gradient is their
        sum): the data-parallel ranks, times the context-parallel ones (each holds part of a
        sequence, and FSDP2 shards over both: "dp_shard_cp"). A loss that is `sum / items of the
        whole step` is multiplied by it."""
        if self.layout is None:
            return self.world_size
        return self.layout.data_world_size * self.layout.sizes.get("cp", 1)

    def parallel_size(self, dim: str) -> int:
        """The size of mesh dimension `dim` ("tp", "cp", "dp_shard", "dp_replicate"); 1 without a layout."""
        return 1 if self.layout is None else self.layout.sizes.get(dim, 1)

    # -- collectives ------------------------------------------------------------------------
    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", data_only: bool = False) -> torch.Tensor:
        """Reduce in place across processes ("sum", "mean", "max", "min") and return the tensor;
        `data_only`: across the data-parallel ranks only (a value that peers sharing a batch count alike)."""
        if not self.distributed:
            return tensor
        group, size = None, self.world_size
        if data_only and self.layout is not None:
            group, size = self.layout.data_group, self.layout.data_world_size
        ops = {
            "sum": dist.ReduceOp.SUM,
            "mean": dist.ReduceOp.SUM,
            "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN,
        }
        dist.all_reduce(tensor, op=ops[op], group=group)
        if op == "mean":
            tensor /= size
        return tensor

    def any_process(self, flag: bool) -> bool:
        """True on every process if `flag` is True on any; a CPU (gloo) collective, so it never
        waits for the accelerator."""
        if not self.distributed:
            return flag
        if self._cpu_group is None:
            self._cpu_group = (
                dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout_s))
                if self.backend != "gloo"
                else dist.group.WORLD
            )
        box = torch.tensor([int(flag)])
        dist.all_reduce(box, op=dist.ReduceOp.MAX, group=self._cpu_group)
        return bool(box.item())

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Gather a tensor from every process; shapes may differ in the first dimension."""
        if not self.distributed:
            return [tensor]
        tensor = tensor.contiguous()
        sizes = [torch.zeros(1, dtype=torch.long, device=tensor.device) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([tensor.shape[0] if tensor.dim() else 1], device=tensor.device))
        lengths = [int(s.item()) for s in sizes]
        longest = max(lengths)
        if tensor.dim() == 0:
            tensor = tensor.reshape(1)
        if tensor.shape[0] < longest:
            pad = tensor.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))
            tensor = torch.cat([tensor, pad])
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor)
        return [t[:n] for t, n in zip(out, lengths)]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True) -> Iterator[None]:
        """Run the body on the (local) main process first, then on the others."""
        first = self.is_local_main_process if local else self.is_main_process
        if not first:
            self.barrier()
        try:
            yield
        finally:
            if first:
                self.barrier()

    # -- precision --------------------------------------------------------------------------
    def autocast(
        self, dtype: torch.dtype | None, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager:
        """Autocast to `dtype` on this device, or nothing when dtype is None."""
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype, cache_enabled=cache_enabled)

    def grad_scaler(self, enabled: bool) -> torch.amp.GradScaler | None:
        if not enabled:
            return None
        return torch.amp.GradScaler(self.device.type)

    def set_tf32(self, enabled: bool | None) -> None:
        """Allow (or forbid) TF32 matmuls and convolutions; None leaves torch's setting."""
        if enabled is None:
            return
        torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
        torch.backends.cudnn.allow_tf32 = bool(enabled)

    def bf16_supported(self) -> bool:
        if self.device.type == "cuda":
            return torch.cuda.is_bf16_supported()
        return True

    # -- teardown ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Destroy the process group this runtime started (also run at interpreter exit)."""
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False


def _error_file_hook(previous: Any) -> Any:
    """An excepthook that writes an uncaught exception to torchelastic's error file (the JSON that
    torchrun's `@record` writes) before the usual report, so the launcher's failure summary shows
    this rank's error instead of "error_file: <N/A>"."""

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        global _FAILED
        _FAILED = True
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path and not os.path.exists(path):  # a script decorated with @record wrote it already
            try:
                message = {
                    "message": f"{exc_type.__name__}: {exc}",
                    "extraInfo": {
                        "py_callstack": "".join(traceback.format_exception(exc_type, exc, tb)),
                        "timestamp": str(int(time.time())),
                    },
                }
                with open(path, "w") as f:
                    json.dump({"message": message}, f)
            except OSError:
                pass  # the traceback below still reaches stderr
        previous(exc_type, exc, tb)

    hook._trainwright_error_file = True  # type: ignore[attr-defined]
    return hook


_RUNTIME: Runtime | None = None
_FAILED = False  # an uncaught exception is ending the process


def _shutdown_at_exit() -> None:
    # After a failure, peers may still be inside a collective with us: leave the group to process
    # exit rather than risk waiting on it (NCCL's teardown can block on unfinished work).
    if _RUNTIME is not None and not _FAILED:
        _RUNTIME.shutdown()


def get_runtime(use_cpu: bool = False, backend: str | None = None, timeout_s: int = 1800) -> Runtime:
    """Return this process's runtime, starting the process group on first use under torchrun."""
    global _RUNTIME
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    cuda = torch.cuda.is_available() and not use_cpu
    if cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    elif not use_cpu and torch.backends.mps.is_available() and world_size == 1:
        device = torch.device("mps")
    else:
        device = torch.device("cpu")
    if _RUNTIME is not None:
        if _RUNTIME.device == device:
            return _RUNTIME
        if _RUNTIME.distributed:
            raise ValueError(
                f"use_cpu={use_cpu}: this process already trains on {_RUNTIME.device} in a process group; "
                "every Trainer of a distributed run must use the same device (set use_cpu alike)."
            )
        # one process: a later Trainer with another use_cpu gets its own device
    if cuda:
        torch.cuda.set_device(device)
    owns = False
    chosen = None
    if world_size > 1:
        chosen = backend or ("nccl" if device.type == "cuda" else "gloo")
        if not dist.is_initialized():
            missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
            if missing:
                raise RuntimeError(
                    f"WORLD_SIZE={world_size} asks for several processes but {' and '.join(missing)} "
                    "is not set: launch with torchrun (or set MASTER_ADDR and MASTER_PORT)."
                )
            device_id: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
            dist.init_process_group(
                backend=chosen,
                timeout=datetime.timedelta(seconds=timeout_s),
                **device_id,
            )
            owns = True
        else:
            chosen = dist.get_backend()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if not getattr(sys.excepthook, "_trainwright_error_file", False):
            sys.excepthook = _error_file_hook(sys.excepthook)
    _RUNTIME = Runtime(
        device=device,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        backend=chosen,
        timeout_s=timeout_s,
        _owns_group=owns,
    )
    if owns:
        atexit.register(_shutdown_at_exit)
    return _RUNTIME


def reset_runtime() -> None:
    """Forget the cached runtime (tears down a process group it started). For tests and teardown."""
    global _RUNTIME
    if _RUNTIME is not None:
        _RUNTIME.shutdown()
    _RUNTIME = None

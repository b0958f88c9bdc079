"""This process's runtime (device, ranks, the main-process-first barrier) for the layers below
`distributed/`, which may not import it.

`TrainingArguments.device`, `.world_size`, `.should_save` and friends ask `get_runtime` here; the
package's top level registers `trainwright.distributed.runtime.get_runtime` as the provider when
`trainwright` is imported, so the first read starts the runtime exactly as before (and the
runtime module's `get_runtime` is looked up at each call, so patching it takes effect).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import torch


class ProcessRuntime(Protocol):
    """What the lower layers read of `trainwright.distributed.runtime.Runtime`."""

    device: torch.device
    rank: int
    local_rank: int
    world_size: int

    @property
    def is_main_process(self) -> bool: ...

    @property
    def is_local_main_process(self) -> bool: ...

    def main_process_first(self, local: bool = True) -> AbstractContextManager[None]: ...


RuntimeProvider = Callable[..., ProcessRuntime]
_PROVIDER: RuntimeProvider | None = None


def register_runtime(provider: RuntimeProvider) -> None:
    """Set what `get_runtime` calls: `provider(use_cpu=..., backend=..., timeout_s=...)`."""
    global _PROVIDER
    _PROVIDER = provider


def get_runtime(
    *, use_cpu: bool = False, backend: str | None = None, timeout_s: int = 1800
) -> ProcessRuntime:
    """This process's runtime, from the registered provider (started on first use)."""
    if _PROVIDER is None:
        raise RuntimeError(
            "no runtime is registered: `import trainwright` registers trainwright.distributed.runtime's"
        )
    return _PROVIDER(use_cpu=use_cpu, backend=backend, timeout_s=timeout_s)

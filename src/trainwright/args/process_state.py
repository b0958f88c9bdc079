"""accelerate's view of the processes, for code written against it: `TrainingArguments.distributed_state`,
`.deepspeed_plugin` and `trainer.accelerator.state` (TRL reads them to choose a code path).

trainwright does not run on accelerate, so these are answers, not accelerate objects: the
distributed type under accelerate's names, the process facts of trainwright's runtime, and the
plugins as None where the run uses neither DeepSpeed nor FSDP. A run that does use one of them is
configured by trainwright, not by accelerate's plugin objects, so asking for the plugin then raises
an error that names the attribute instead of handing over an object that behaves differently.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import Any

import torch

from trainwright.args import properties


class DistributedType(str, enum.Enum):
    """accelerate's `DistributedType` names for the backends trainwright runs (compares equal to the
    same strings, as accelerate's does)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ProcessState:
    """The attributes of accelerate's `AcceleratorState` that libraries read, for this process."""

    distributed_type: DistributedType
    num_processes: int
    process_index: int
    local_process_index: int
    device: torch.device
    mixed_precision: str  # "no", "bf16" or "fp16"
    backend: str | None
    _args: Any = None

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def deepspeed_plugin(self) -> None:
        return deepspeed_plugin(self._args)

    @property
    def fsdp_plugin(self) -> None:
        if self._args is not None and self._args.fsdp:
            raise _plugin_error("fsdp_plugin", "fsdp", "FSDP2 from `fsdp` / `fsdp_config`")
        return None


def mixed_precision(args: Any) -> str:
    """accelerate's name for the arguments' autocast: "bf16", "fp16" or "no"."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "no"


def distributed_type(args: Any) -> DistributedType:
    rt = properties.runtime(args)
    if args.deepspeed:
        return DistributedType.DEEPSPEED
    if args.fsdp and rt.world_size > 1:
        return DistributedType.FSDP
    if rt.world_size > 1:
        return DistributedType.MULTI_GPU if rt.device.type == "cuda" else DistributedType.MULTI_CPU
    return DistributedType.NO


def process_state(args: Any) -> ProcessState:
    """This process's `ProcessState` under the arguments (asks the runtime; starts it if needed)."""
    rt = properties.runtime(args)
    return ProcessState(
        distributed_type=distributed_type(args),
        num_processes=rt.world_size,
        process_index=rt.rank,
        local_process_index=rt.local_rank,
        device=rt.device,
        mixed_precision=mixed_precision(args),
        backend=rt.backend if rt.distributed else None,
        _args=args,
    )


def deepspeed_plugin(args: Any) -> None:
    """None without `deepspeed`; with it, an error naming the attribute (see the module docstring)."""
    if args is not None and args.deepspeed:
        raise _plugin_error("deepspeed_plugin", "deepspeed", "DeepSpeed from the `deepspeed` config")
    return None


def _plugin_error(attribute: str, argument: str, what: str) -> AttributeError:
    return AttributeError(
        f"{attribute}: this run sets `{argument}`, and trainwright runs {what} itself, without "
        f"accelerate's plugin object, so code that configures models through `{attribute}` (TRL's "
        "reference and reward models, for one) cannot be honoured. Train without "
        f"`{argument}` (one process or DDP), or on transformers.Trainer."
    )


def start_accelerate_state(args: Any) -> None:
    """accelerate's `PartialState` for this process, as transformers' arguments start it when built:
    for a library's subclass of the arguments (TRL's configs), whose trainers log through
    `accelerate.logging` before the Trainer exists. trainwright's own arguments start nothing."""
    if "accelerate" not in sys.modules:
        return
    from accelerate.state import PartialState

    if not PartialState._shared_state:
        PartialState(cpu=args.use_cpu)


def check_configured_state(args: Any) -> None:
    """`accelerator_config` `use_configured_state=True`: the run's processes and device are those of
    the accelerate `PartialState` (or `Accelerator`) made before the arguments. Without one the
    arguments are refused, as transformers refuses them; one that disagrees with the processes
    trainwright trains on (another device, another world size) is refused naming both."""
    if not getattr(args.accelerator_config, "use_configured_state", False):
        return
    state = _configured_state()
    if state is None:
        raise ValueError(
            f"{type(args).__name__}: accelerator_config['use_configured_state']=True needs an accelerate "
            "`PartialState` or `Accelerator` made before the arguments; make one first, or leave "
            "use_configured_state False (the default)"
        )
    if args.deepspeed and state.distributed_type != "DEEPSPEED":  # a str enum
        raise ValueError(
            f"{type(args).__name__}: accelerator_config['use_configured_state']=True with `deepspeed`, but the "
            f"configured accelerate state is {state.distributed_type}, not DeepSpeed; leave use_configured_state "
            "False or configure accelerate for DeepSpeed"
        )


def _configured_state() -> Any:
    """accelerate's `PartialState` where one was made in this process, else None."""
    if "accelerate" not in sys.modules:
        return None
    from accelerate.state import PartialState

    return PartialState() if PartialState._shared_state else None


def configured_state_agrees(args: Any, runtime: Any) -> None:
    """With `use_configured_state=True`, the accelerate state's device and processes are the runtime's."""
    state = _configured_state() if getattr(args.accelerator_config, "use_configured_state", False) else None
    if state is None:
        return
    theirs = (state.device.type, state.num_processes)
    ours = (runtime.device.type, runtime.world_size)
    if theirs != ours:
        raise ValueError(
            f"{type(args).__name__}: accelerator_config['use_configured_state']=True, but the configured "
            f"accelerate state trains on {theirs[0]} with {theirs[1]} processes and this run on {ours[0]} with "
            f"{ours[1]}; configure accelerate as the run is launched (use_cpu, the launcher), or leave "
            "use_configured_state False"
        )

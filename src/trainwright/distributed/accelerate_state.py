"""accelerate's process-wide state, set from trainwright's runtime for the libraries that read it.

transformers' Trainer builds an `accelerate.Accelerator`, which initializes accelerate's global
`AcceleratorState`; libraries built on the Trainer then read that state directly (TRL's GRPO calls
`accelerate.utils.set_seed(seed, device_specific=True)`, which adds `AcceleratorState().process_index`).
trainwright does not run on accelerate, but where accelerate is imported it initializes the same
state from its own runtime: the same processes (the process group trainwright started is reused),
the same device and the same mixed precision, so those reads give what they give under transformers.

Runs with `deepspeed` or FSDP over several processes are left out: accelerate's state would then
carry plugins trainwright does not use, so a library reading it gets accelerate's own error instead
of an answer that is wrong.
"""

from __future__ import annotations

import sys
from typing import Any


def share_with_accelerate(args: Any, runtime: Any) -> bool:
    """Initialize accelerate's `AcceleratorState` for this process when accelerate is imported (a
    library that reads it is in use). Returns whether it did."""
    if "accelerate" not in sys.modules or args.deepspeed or (args.fsdp and runtime.world_size > 1):
        return False
    from accelerate.state import AcceleratorState
    from accelerate.utils import TorchDynamoPlugin

    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "no"
    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision") != precision:
        AcceleratorState._reset_state()  # as transformers does between Trainers of other settings
    AcceleratorState(
        mixed_precision=precision,
        cpu=runtime.device.type == "cpu",
        dynamo_plugin=TorchDynamoPlugin(),  # compiling is trainwright's (`torch_compile`), not accelerate's
        _from_accelerator=True,
    )
    return True

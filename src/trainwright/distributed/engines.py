"""Which engine runs a run: `build_engine`, decided once per run from the arguments and the model.

Each engine is its own class (`engine.py`: plain / DDP, FSDP2, DeepSpeed; `nd_engine.py`: tensor
parallel x FSDP2 from `parallelism_config`, and its context-parallel variant); adding one is its file plus its line here.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from trainwright.distributed import fsdp, parallelism
from trainwright.distributed.engine import DeepSpeedEngine, Engine, FSDPEngine
from trainwright.distributed.nd_engine import ContextParallelEngine, NDEngine

logger = logging.getLogger(__name__)


def build_engine(args: Any, runtime: Any, module: nn.Module) -> Engine:
    """The engine for these arguments and this model."""
    if getattr(module, "_is_distributed_loading_by_transformers", False):
        name = type(module).__name__
        raise ValueError(
            f"{name} was sharded when it was loaded (from_pretrained(tp_plan=... or distributed_config=...)); "
            "trainwright lays a model out itself, from TrainingArguments.parallelism_config. Load it without "
            f'tp_plan / distributed_config and pass parallelism_config={{"tp_size": N, "dp_shard_size": M}}: '
            f"{name}'s own tensor-parallel plan is applied the same way."
        )
    if args.deepspeed:
        return DeepSpeedEngine(args, runtime, module)
    sizes = (
        parallelism.requested(args, runtime)
        if getattr(args, "parallelism_config", None) is not None
        else None
    )
    if sizes is not None:
        return (ContextParallelEngine if sizes.cp_size > 1 else NDEngine)(args, runtime, module)
    parallelism.check_layout(args, runtime)
    sharding = fsdp.fsdp_options(args)
    if sharding and not runtime.distributed:
        logger.warning("fsdp=%s is set but this is one process: training without sharding.", sharding)
    elif (sharding and sharding != ["no_shard"]) or fsdp.is_sharded(module):
        return FSDPEngine(args, runtime, module)
    return Engine(args, runtime, module)

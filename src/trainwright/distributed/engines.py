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
from trainwright.distributed.nd_engine import ContextParallelEngine, LoadedLayoutEngine, NDEngine

logger = logging.getLogger(__name__)


def build_engine(args: Any, runtime: Any, module: nn.Module) -> Engine:
    """The engine for these arguments and this model."""
    if args.deepspeed:
        return DeepSpeedEngine(args, runtime, module)
    if parallelism.loaded_layout(module, runtime) is not None:  # sharded by transformers' from_pretrained
        return LoadedLayoutEngine(args, runtime, module)
    sizes = (
        parallelism.requested(args, runtime)
        if getattr(args, "parallelism_config", None) is not None
        else None
    )
    if sizes is not None:
        return (ContextParallelEngine if sizes.cp_size > 1 else NDEngine)(args, runtime, module)
    sharding = fsdp.fsdp_options(args)
    if sharding and not runtime.distributed:
        logger.warning("fsdp=%s is set but this is one process: training without sharding.", sharding)
    elif (sharding and sharding != ["no_shard"]) or fsdp.is_sharded(module):
        return FSDPEngine(args, runtime, module)
    return Engine(args, runtime, module)

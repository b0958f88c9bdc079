"""What `TrainingArguments` derives from its fields: warmup steps, the process's log level, and
the process facts (device, ranks, who logs and saves) that it asks the runtime for lazily, the
first time one is read; building the arguments touches no device and no process group."""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

from trainwright.args.checks import LOG_LEVELS, is_int
from trainwright.core import runtime as runtime_module


def warmup_steps(args: Any, num_training_steps: int) -> int:
    """Warmup steps for a run of `num_training_steps` optimizer steps (see `get_warmup_steps`)."""
    if not is_int(num_training_steps) or num_training_steps < 0:
        raise ValueError(
            f"get_warmup_steps: num_training_steps must be an integer >= 0, got {num_training_steps!r}"
        )
    if isinstance(args.warmup_steps, float) and 0 < args.warmup_steps < 1:
        fraction = args.warmup_steps
    elif args.warmup_steps > 0:
        return int(args.warmup_steps)
    else:
        fraction = args.warmup_ratio or 0.0  # None: unset
    return math.ceil(num_training_steps * fraction)


def process_log_level(args: Any) -> int:
    """Log level for this process (see `get_process_log_level`)."""
    name = args.log_level if args.should_log else args.log_level_replica
    level = LOG_LEVELS[name]
    if level != -1:
        return level
    if "transformers" in sys.modules:
        import transformers.utils.logging as hf_logging

        return hf_logging.get_verbosity()
    return logging.getLogger("trainwright").getEffectiveLevel()


def runtime(args: Any) -> runtime_module.Runtime:
    """This process's runtime for the arguments' device and process-group settings (looked up at each
    call, so a patched `get_runtime` takes effect)."""
    return runtime_module.get_runtime(
        use_cpu=args.use_cpu, backend=args.ddp_backend, timeout_s=args.ddp_timeout
    )

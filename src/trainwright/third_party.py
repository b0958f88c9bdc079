"""Keeping third-party packages from doing what nobody asked for.

`accelerate.utils.extract_model_from_parallel`, which transformers' `save_pretrained` calls on every
save, imports `deepspeed` whenever it is installed, only to test `isinstance(model,
DeepSpeedEngine)`. That import costs seconds and, on a machine without a GPU, prints DeepSpeed's
"Setting accelerator to CPU" warning, in runs that never asked for DeepSpeed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def deepspeed_left_unimported() -> Iterator[None]:
    """Within the block, accelerate treats DeepSpeed as absent unless it is already imported.

    Exact, not a guess: while `deepspeed` has not been imported no `DeepSpeedEngine` can exist, so
    the isinstance test it was imported for is False anyway. Once the DeepSpeed integration (or the
    user) has imported it, nothing changes."""
    other = sys.modules.get("accelerate.utils.other")
    if "deepspeed" in sys.modules:
        yield
        return
    if other is None:
        try:
            import accelerate.utils.other as other
        except ImportError:  # no accelerate: nothing would import deepspeed on our behalf
            yield
            return
    original = other.is_deepspeed_available
    other.is_deepspeed_available = _not_in_use
    try:
        yield
    finally:
        if other.is_deepspeed_available is _not_in_use:
            other.is_deepspeed_available = original


def _not_in_use() -> bool:
    return False

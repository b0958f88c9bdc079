"""Keeping third-party packages from doing what nobody asked for.

`accelerate.utils.extract_model_from_parallel`, which transformers' `save_pretrained` calls on every
save, imports `deepspeed` whenever it is installed, only to test `isinstance(model,
DeepSpeedEngine)`. That import costs seconds and, on a machine without a GPU, prints DeepSpeed's
"Setting accelerator to CPU" warning, in runs that never asked for DeepSpeed.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_depth = 0  # blocks open in any thread (a reporter's worker thread may export a model meanwhile)
_original: Any = None


@contextlib.contextmanager
def deepspeed_left_unimported() -> Iterator[None]:
    """Within the block, accelerate treats DeepSpeed as absent unless it is already imported.

    Exact, not a guess: while `deepspeed` has not been imported no `DeepSpeedEngine` can exist, so
    the isinstance test it was imported for is False anyway. Once the DeepSpeed integration (or the
    user) has imported it, nothing changes. Blocks may overlap across threads: accelerate's own
    function is put back when the last one ends."""
    global _depth, _original
    if "deepspeed" in sys.modules:
        yield
        return
    try:
        import accelerate.utils.other as other
    except ImportError:  # no accelerate: nothing would import deepspeed on our behalf
        yield
        return
    with _lock:
        if _depth == 0:
            _original = other.is_deepspeed_available
            other.is_deepspeed_available = _not_in_use
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if other.is_deepspeed_available is _not_in_use:
                    other.is_deepspeed_available = _original
                _original = None


def _not_in_use() -> bool:
    return False

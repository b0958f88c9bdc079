"""Keeping third-party packages from doing what nobody asked for.

DeepSpeed:
`accelerate.utils.extract_model_from_parallel`, which transformers' `save_pretrained` calls on every
save, imports `deepspeed` whenever it is installed, only to test `isinstance(model,
DeepSpeedEngine)`. That import costs seconds and, on a machine without a GPU, prints DeepSpeed's
"Setting accelerator to CPU" warning, in runs that never asked for DeepSpeed.

transformers: `save_pretrained` draws a "Writing model shards" progress bar on every save, a
checkpoint's included, even for a single file.

TensorFlow: `torch.utils.tensorboard` resolves TensorBoard's TF-compat module when it is imported, and
that imports TensorFlow whenever it is installed (seconds, and six lines of TensorFlow start-up on the
console) only to use its file functions; TensorBoard has its own for local files.
"""

from __future__ import annotations

import contextlib
import importlib
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


_SHARD_BAR = "Writing model shards"
_bar_depth = 0
_bar_previous: Any = None


@contextlib.contextmanager
def shard_progress_bar_hidden() -> Iterator[None]:
    """Within the block, transformers' "Writing model shards" bar is created disabled (through its
    public `set_tqdm_hook`, chained to any hook already set); every other bar is left as it is.
    Blocks may overlap across threads: the previous hook is put back when the last one ends."""
    global _bar_depth, _bar_previous
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    if not hasattr(hf_logging, "set_tqdm_hook"):  # older transformers: nothing to hide it with
        yield
        return
    with _lock:
        if _bar_depth == 0:
            _bar_previous = hf_logging.set_tqdm_hook(_hide_shard_bar)
        _bar_depth += 1
    try:
        yield
    finally:
        with _lock:
            _bar_depth -= 1
            if _bar_depth == 0:
                hf_logging.set_tqdm_hook(_bar_previous)
                _bar_previous = None


def _hide_shard_bar(factory: Any, args: tuple, kwargs: dict) -> Any:
    if kwargs.get("desc") == _SHARD_BAR:
        kwargs = {**kwargs, "disable": True}
    if _bar_previous is not None:
        return _bar_previous(factory, args, kwargs)
    return factory(*args, **kwargs)


def tensorboard_without_tensorflow() -> None:
    """Make TensorBoard's TF-compat module (`tensorboard.compat.tf`) its own TensorFlow stub, as
    where TensorFlow is not installed, unless TensorFlow is already imported or the module already
    resolved. Call before importing `torch.utils.tensorboard`.

    TensorBoard's own switch does it: the module resolves to the stub when
    `tensorboard.compat.notf` can be imported, so that name exists while it resolves, and only
    then. The stub writes local folders (and s3:// with boto3); for another remote file system
    import TensorFlow first."""
    if "tensorflow" in sys.modules:
        return
    try:
        compat = importlib.import_module("tensorboard.compat")
    except ImportError:
        return
    key = "tensorboard.compat.notf"
    added = key not in sys.modules
    if added:
        sys.modules[key] = type(sys)(key)
    try:
        compat.tf.io  # noqa: B018  (resolves the lazy module, once for the process)
    finally:
        if added:
            sys.modules.pop(key, None)

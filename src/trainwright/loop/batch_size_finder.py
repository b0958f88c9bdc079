"""`auto_find_batch_size`: retry training with a smaller batch after an out-of-memory error.

As accelerate's `find_executable_batch_size` (which transformers uses): on an out-of-memory error
the per-device train batch size is multiplied by 0.9 (rounded down) and the inner training loop
starts again; at zero it gives up. Between tries the failed try's references are dropped, garbage
is collected, the device cache emptied and the seed set again, so a retry that failed before its
first optimizer step trains exactly as a run started at the smaller size. The size that fits is
recorded in `TrainerState.train_batch_size` (so in every checkpoint), and a resume with
`auto_find_batch_size` starts from it. Only the training batch is searched: an evaluation out of
memory is an error.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from trainwright.args.training_args import TrainingArguments
from trainwright.core.seed import enable_full_determinism, set_seed
from trainwright.core.state import TrainerState
from trainwright.distributed import device_cache

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Messages of the allocators' out-of-memory errors (accelerate's list): CUDA/HIP/XPU/NPU, MPS,
# cuDNN's "not supported" (a workspace that does not fit), CPU, Gaudi.
_OOM_MESSAGES = (
    " out of memory.",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


def should_reduce_batch_size(error: BaseException) -> bool:
    """Whether `error` is an allocator's out-of-memory error (a smaller batch may fit)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    if isinstance(error, RuntimeError) and len(error.args) == 1 and isinstance(error.args[0], str):
        return any(message in error.args[0] for message in _OOM_MESSAGES)
    return False


def next_batch_size(batch_size: int) -> int:
    """accelerate's decay: 90% of the batch, rounded down."""
    return int(batch_size * 0.9)


def find_executable_batch_size(
    function: Callable[[int], T], starting_batch_size: int, on_retry: Callable[[], None] = lambda: None
) -> T:
    """Call `function(batch_size)` from `starting_batch_size` down until it runs without running out
    of memory; `on_retry` is called (outside the failed call's frames) before each new try."""
    batch_size = starting_batch_size
    while True:
        if batch_size <= 0:
            raise RuntimeError("auto_find_batch_size: no executable batch size found, reached zero.")
        failed = None
        try:
            return function(batch_size)
        except Exception as e:  # noqa: BLE001 - only out-of-memory errors are retried
            if not should_reduce_batch_size(e):
                raise
            failed = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        # Here the exception and its traceback (which hold the failed step's tensors) are gone.
        smaller = next_batch_size(batch_size)
        logger.warning(
            "auto_find_batch_size: batch size %d ran out of memory (%s); retrying with %d.",
            batch_size,
            failed,
            smaller,
        )
        batch_size = smaller
        on_retry()


def saved_batch_size(checkpoint: str) -> int | None:
    """The per-device train batch size a checkpoint's run used (`TrainerState.train_batch_size`)."""
    state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
    return state.train_batch_size


def train_with_search(
    args: TrainingArguments,
    start: int,
    device: Any,
    forget_failed_run: Callable[[], None],
    resume_path: str | None,
    run: Callable[[int], T],
) -> T:
    """Run the inner loop `run(batch_size)` under the batch size search, from `start` (a resumed
    checkpoint's size first). For each try `args.per_device_train_batch_size` is the size being
    tried (everything that reads the batch geometry, checkpoints included, sees the real one); the
    caller's value is put back at the end, and the inner loop keeps the size for the next `train()`.
    Each try builds a run of its own; the failed one is dropped (`forget_failed_run`) before the next."""
    given = args.per_device_train_batch_size
    if resume_path is not None:
        start = saved_batch_size(resume_path) or start

    def attempt(batch_size: int) -> T:
        args.per_device_train_batch_size = batch_size
        return run(batch_size)

    def reset() -> None:
        forget_failed_run()
        device_cache.empty_device_cache(device, collect_garbage=True)
        # The random streams start again as at the first try: dropout and data order of the retry are
        # those of a run started at this batch size.
        if args.full_determinism:
            enable_full_determinism(args.seed)
        else:
            set_seed(args.seed)

    try:
        return find_executable_batch_size(attempt, start, on_retry=reset)
    finally:
        args.per_device_train_batch_size = given


def inner_loop(
    function: Callable[..., Any],
    args: TrainingArguments,
    found: int | None,
    device: Any,
    forget_failed_run: Callable[[], None],
    resume_path: str | None,
) -> Callable[..., Any]:
    """The Trainer's `_inner_training_loop` (`function`, bound) with its `batch_size` bound: the
    given one, or, with `auto_find_batch_size`, the one the search settles on (upstream's
    `find_executable_batch_size`), starting from the size an earlier `train()` found (`found`)."""
    if not args.auto_find_batch_size:
        return functools.partial(function, batch_size=args.per_device_train_batch_size)
    start = found or args.per_device_train_batch_size

    def search(**kwargs: Any) -> Any:
        def run(size: int) -> Any:
            return function(batch_size=size, **kwargs)

        return train_with_search(args, start, device, forget_failed_run, resume_path, run)

    return search


@contextlib.contextmanager
def evaluation_oom_is_an_error() -> Iterator[None]:
    """An out-of-memory error in an evaluation during training must not shrink the training batch."""
    try:
        yield
    except RuntimeError as e:
        if should_reduce_batch_size(e):
            raise RuntimeError(
                "Evaluation hit an out-of-memory error. auto_find_batch_size only adjusts the training batch size: "
                "reduce per_device_eval_batch_size (or set eval_accumulation_steps)."
            ) from e
        raise

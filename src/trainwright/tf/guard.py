"""What surrounds a `TFTrainer.train()` call, as a PyTorch `Trainer.train()`: one writer per
`output_dir` (`distributed.output_lock`) and save-and-exit on the preemption signals
(`distributed.preemption`), agreed over every `MultiWorkerMirroredStrategy` worker.

The chief (worker 0) checks and locks `output_dir`; with several workers every worker learns the
outcome, so all of them stop instead of waiting for the chief in the first step. A preemption signal
is acted on at the end of the step: every worker sees it at the same step (one all-reduce of a flag
per step, only with several workers), the checkpoint is written, `on_train_end` fires, and the
process exits with status 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from trainwright.core.output_lock import OutputDirError, claim_output_dir
from trainwright.core.preemption import PreemptionGuard

logger = logging.getLogger(__name__)


def any_worker(args: Any, flag: bool) -> bool:
    """Whether `flag` is true on any worker (this one's value without several workers)."""
    if args.world_size <= 1:
        return flag
    strategy = args.strategy
    value = tf.constant(1.0 if flag else 0.0)
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(value)), axis=None)
    return float(total) > 0


def guarded_train(trainer: Any, run: Callable[[], Any]) -> Any:
    """`run()` with `output_dir` claimed and the preemption signals caught; exits 0 when preempted."""
    args = trainer.args
    lock, failure = None, None
    try:
        lock = claim_output_dir(args, getattr(trainer, "runtime", None))
    except OutputDirError as exc:
        failure = exc
    try:
        if any_worker(args, failure is not None):
            raise failure or OutputDirError(
                f"output_dir={args.output_dir!r} could not be claimed by worker 0 (its error says why)"
            )
        with PreemptionGuard(args.preemption_signals) as trainer._preemption:
            output = run()
        if trainer._preemption.requested is not None:
            logger.warning(
                "Preempted by %s: checkpoint written, exiting.", trainer._preemption.requested.name
            )
            raise SystemExit(0)
        return output
    finally:
        if lock is not None:
            lock.release()


def preempted(trainer: Any) -> bool:
    """A preemption signal reached this worker (or, with several, any worker) during `train()`."""
    guard = trainer._preemption
    return any_worker(trainer.args, guard is not None and guard.requested is not None)

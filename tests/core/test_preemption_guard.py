"""`PreemptionGuard` records a signal while it is in force, and `preemption.requested()` answers for
the `train()` running now (what `JITCheckpointCallback.jit_manager` reports): a request of a
finished run does not answer for the next."""

from __future__ import annotations

import os
import signal

from trainwright.core import preemption
from trainwright.core.preemption import PreemptionGuard


def test_a_request_answers_only_while_its_guard_is_in_force():
    assert preemption.requested() is None
    with PreemptionGuard(["SIGUSR1"]) as guard:
        assert preemption.requested() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert guard.requested == signal.SIGUSR1 and preemption.requested() == signal.SIGUSR1
    assert preemption.requested() is None  # the run is over: the next starts without a request
    with PreemptionGuard(["SIGUSR1"]):
        assert preemption.requested() is None

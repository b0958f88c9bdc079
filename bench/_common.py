"""Small pieces shared by the benchmark scripts: quiet output, a step clock, a method timer, the
machine's load, summaries."""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from trainwright.core.events import TrainerCallback


class TokenRows:
    """`n` random rows of `seq` token ids below `vocab` (seeded), each its own labels: a causal LM's
    batch for the multi-process benches."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        import torch

        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def add_threads_argument(parser: Any) -> None:
    """`--threads N` (default 1): small steps on several threads mostly time thread wake-ups."""
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: small steps on several threads time thread wake-ups "
        "and whatever else runs on the machine; 0 leaves torch's default)",
    )


def apply_threads(threads: int) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


# glibc reads these at start-up; fixed, they stop it moving its mmap threshold with whatever the
# process freed last (left dynamic, GPT-2's activations come from fresh mmaps, thousands of page
# faults a step, in some runs and from the reused heap in others: +-5% between runs)
MALLOC_FIXED = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(4 * 2**30)}


def add_malloc_argument(parser: Any) -> None:
    """`--malloc fixed|default` (default fixed): glibc's mmap/trim thresholds pinned, or left dynamic."""
    parser.add_argument(
        "--malloc",
        choices=("fixed", "default"),
        default="fixed",
        help="fixed: run with glibc's mmap and trim thresholds pinned, the same for every variant "
        "(default); default: the allocator as users meet it (its dynamic threshold varies runs +-5%%)",
    )


def apply_malloc(mode: str) -> str:
    """Re-run this script with `MALLOC_FIXED` set when `mode` is fixed (on glibc); say which it is."""
    if mode != "fixed" or platform.libc_ver()[0] != "glibc":
        return "allocator as is"
    if any(os.environ.get(k) != v for k, v in MALLOC_FIXED.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_FIXED})
    return "glibc malloc thresholds fixed"


def quiet() -> None:
    """Silence warnings and library logging so the printed table is the whole output."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("WANDB_MODE", "disabled")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


class StepClock(TrainerCallback):
    """Timestamps optimizer step ends (one perf_counter call per step, same cost in every variant).

    `first` and `last` are the perf_counter values at the end of the first and latest step of the
    run, `first_cpu` the process CPU time (`time.process_time`) at the first; `steps` counts them;
    with `keep_all`, `times` and `cpu_times` hold every step end's wall and CPU time (on a shared
    machine other processes' load lengthens wall time much more than CPU time). `probe()` is
    called once at the end of the first step and its result kept in `probed` (e.g. a dataset's
    call count). With `stop_after`, training stops after that many steps (everything after the
    last timestamp is outside what is measured).
    """

    def __init__(
        self, stop_after: int | None = None, probe: Callable[[], Any] | None = None, keep_all: bool = False
    ) -> None:
        self.stop_after = stop_after
        self.probe = probe
        self.first: float | None = None
        self.first_cpu: float | None = None
        self.last: float | None = None
        self.steps = 0
        self.probed: Any = None
        self.times: list[float] | None = [] if keep_all else None
        self.cpu_times: list[float] | None = [] if keep_all else None

    def on_step_end(self, args, state, control, **kwargs):
        now, cpu = time.perf_counter(), time.process_time()
        self.steps += 1
        self.last = now
        if self.times is not None:
            self.times.append(now)
            self.cpu_times.append(cpu)
        if self.first is None:
            self.first, self.first_cpu = now, cpu
            if self.probe is not None:
                self.probed = self.probe()
        if self.stop_after is not None and self.steps >= self.stop_after:
            control.should_training_stop = True
        return control


class MethodTimer:
    """Within the block, times every call of the given `(owner, attribute name)` functions.

    `calls[label]` lists each call's seconds (label: "Owner.name"); `total` is their sum. The
    owner's attribute is replaced by a timing wrapper and put back on exit, so it only sees calls
    made through that attribute (a module function or a class method looked up at call time).
    """

    def __init__(self, targets: list[tuple[Any, str]]) -> None:
        self.targets = targets
        self.calls: dict[str, list[float]] = {}
        self._originals: list[tuple[Any, str, Any]] = []

    @property
    def total(self) -> float:
        return sum(sum(v) for v in self.calls.values())

    def __enter__(self) -> MethodTimer:
        for owner, name in self.targets:
            original = getattr(owner, name)
            label = f"{getattr(owner, '__name__', type(owner).__name__).rsplit('.', 1)[-1]}.{name}"
            record = self.calls.setdefault(label, [])

            def timed(*args, _original=original, _record=record, **kwargs):
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    _record.append(time.perf_counter() - start)

            # None: the attribute was inherited, so on exit the wrapper is deleted, not replaced.
            self._originals.append((owner, name, vars(owner).get(name)))
            setattr(owner, name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._originals):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._originals.clear()


def load_average() -> str:
    """The machine's 1-minute load average and core count, to read timings against."""
    try:
        return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    except OSError:
        return f"{os.cpu_count()} cores"


def summary(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    """`median (min..max, n=N)` of a list of measurements."""
    v = [x * scale for x in values]
    return f"median {statistics.median(v):8.3f} {unit}  (min {min(v):.3f}, max {max(v):.3f}, n={len(v)})"


def launch_job(script: str, cfg: dict, nproc: int, env: dict | None = None, timeout: int = 1800) -> None:
    """Run `script --worker <cfg as JSON>` in `nproc` processes on this node (torchrun when more than
    one), with `cfg["threads"]` torch threads each; exits naming the job and its output if it fails."""
    full_env = {**os.environ, "OMP_NUM_THREADS": str(cfg["threads"]), **(env or {})}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # this driver's own torchrun, if any
        full_env.pop(name, None)
    worker = [script, "--worker", json.dumps(cfg)]
    if nproc == 1:
        cmd = [sys.executable, *worker]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launcher = ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1"]
        cmd = [sys.executable, *launcher, f"--master_port={port}", *worker]
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(
            f"benchmark job failed ({' '.join(cmd[:6])} ...):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )

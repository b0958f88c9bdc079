"""The host a run starts on: torch's CPU threads against the CPUs this process may use and the load.

PyTorch starts one intra-op thread per CPU. When other processes already keep those CPUs busy, the
threads wait on each other at every parallel op: a CPU run can be ten times slower than with
`OMP_NUM_THREADS=1` (see the README, "Threads under load"). The Trainer's start line says how it
stands, so a slow run can be told from a slow model.
"""

from __future__ import annotations

import os

import torch


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average, or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _oversubscribed(threads: int, cpus: int, load: float | None) -> bool:
    return load is not None and load > cpus and threads > 1


def threads_and_load() -> str:
    """`threads=N (CPUs=M, load=L)`, with a hint when the machine is busier than its CPUs and torch
    runs more than one thread."""
    threads, cpus, load = torch.get_num_threads(), usable_cpus(), load_average()
    hint = ""
    if _oversubscribed(threads, cpus, load):
        hint = ": busier than its CPUs, OMP_NUM_THREADS=1 may run faster"
    return f"threads={threads} (CPUs={cpus}, load={'?' if load is None else f'{load:.2f}'}{hint})"


def busy_warning() -> str | None:
    """The warning for a CPU run on a machine busier than its CPUs with torch running several threads
    (None otherwise): the start line's hint, where a console shows warnings (it logs at INFO)."""
    threads, cpus, load = torch.get_num_threads(), usable_cpus(), load_average()
    if not _oversubscribed(threads, cpus, load):
        return None
    return (
        f"This machine is busier than its CPUs (load {load:.2f} on {cpus} CPUs) and torch runs {threads} "
        "threads: each waits on the others at every operation, and a CPU run can be many times slower. "
        "Run with OMP_NUM_THREADS=1 (or torch.set_num_threads(1) first thing), or the number of CPUs that "
        "are free (README: Threads under load)."
    )


def free_cpus() -> int:
    """CPUs not kept busy by other processes: usable CPUs less the 1-minute load (at least 1)."""
    cpus, load = usable_cpus(), load_average()
    if load is None:
        return cpus
    return max(1, min(cpus, int(cpus - load + 0.5)))

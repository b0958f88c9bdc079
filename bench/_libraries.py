"""A library built on the Trainer, benchmarked on both trainers: one script runs alternately as
`python SCRIPT --child transformers` (the library on transformers) and `python -m trainwright run
SCRIPT --child trainwright` (the same script on trainwright), each run in a fresh process; each run's
rate is its steps after the warm-up over their time (wall clock, or `--clock thread`: this thread's
CPU time, so other work on a shared machine does not count against either). The best run of each is
compared. Used by bench/trl_sft.py and bench/st_train.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def step_clock(clock_name: str) -> tuple[Any, list[float]]:
    """A transformers callback stamping each step's end, and the list of stamps it fills."""
    import transformers

    clock = time.thread_time if clock_name == "thread" else time.perf_counter
    marks: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(clock())

    return Clock(), marks


def report(trainer: Any, marks: list[float], warmup: int) -> None:
    """Print a child run's library and steady rate as JSON (the parent reads the last line)."""
    library = next(
        c.__module__
        for c in type(trainer).__mro__
        if c.__module__.startswith(("transformers", "trainwright"))
    )
    steady = len(marks) - warmup
    print(json.dumps({"library": library, "steps_per_s": (steady - 1) / (marks[-1] - marks[warmup])}))


def _run_once(script: str, library: str, ns: argparse.Namespace) -> float:
    entry = (
        [sys.executable, script]
        if library == "transformers"
        else [sys.executable, "-m", "trainwright", "run", script]
    )
    flags = ["--child", library, "--steps", str(ns.steps), "--warmup", str(ns.warmup)]
    flags += ["--threads", str(ns.threads), "--clock", ns.clock]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CI": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["WANDB_MODE"] = "disabled"
    done = subprocess.run([*entry, *flags], capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{library} run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["library"].startswith(library), result  # the run really trained on that library
    return result["steps_per_s"]


def compare(
    script: str, doc: str, title: str, child: Callable[[argparse.Namespace], None], steps: int
) -> None:
    """The command line of a library bench: `--child` runs `child`, else alternating runs compared."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads in each run (0: torch's default)"
    )
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--child", choices=("transformers", "trainwright"), help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.steps < ns.warmup + 10:
        parser.error(f"--steps must be >= --warmup + 10 ({ns.warmup + 10}) to measure steady steps")
    if ns.child:
        import torch

        if ns.threads:
            torch.set_num_threads(ns.threads)
        child(ns)
        return
    rates: dict[str, list[float]] = {"transformers": [], "trainwright": []}
    for _ in range(ns.repeats):
        for library in rates:  # alternating, so drifts of the machine's load fall on both
            rates[library].append(_run_once(script, library, ns))
    for library, values in rates.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{library:12s} steps/s per run: {shown}  (best {max(values):.1f})")
    threads = ns.threads or "default"
    print(
        f"load average {os.getloadavg()[0]:.2f}, {threads} torch thread(s), {ns.clock} clock, {ns.steps} steps"
    )
    print(
        f"{title} steps/s, trainwright / transformers: {max(rates['trainwright']) / max(rates['transformers']):.3f}"
    )

"""The bench scripts run, at their smallest sizes, against the code as it is now.

They reach into the Trainer (its run, its checkpointer, the engine's switches) to time pieces of a
step; a reshaping of the loop broke three of them without a test noticing (`bench/ddp.py` called a
removed `Runtime.no_sync`, `bench/checkpoint.py` read a removed `Trainer._checkpoint_writer`). The
numbers are not checked here (timings never are in tests): only that each script finishes and
prints its summary.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kit import ROOT

SCRIPTS = {
    "ddp": (
        ["bench/ddp.py", "--steps", "2", "--warmup", "1", "--global-batch", "4", "--seq", "16"]
        + ["--embd", "32", "--layers", "1"],
        "2-process DDP / 1 process",
    ),
    "parallelism": (
        ["bench/parallelism.py", "--steps", "1", "--warmup", "1", "--profiled", "1", "--hidden", "32"]
        + ["--layers", "1", "--seq", "16", "--global-batch", "4", "--vocab", "64", "--heads", "2"],
        "tp=2 / dp_shard=2",
    ),
    "checkpoint": (
        ["bench/checkpoint.py", "--repeats", "1", "--skip", "steps", "--skip", "resume"],
        "async blocked / sync save",
    ),
    "mfu": (["bench/mfu.py", "--tiny", "--steps", "20"], "trainwright / raw"),
    "overhead_bytecodes": (["bench/overhead.py", "--count-bytecodes"], "Python bytecodes per step, tiny MLP"),
    "trl_sft": (
        ["bench/trl_sft.py", "--repeats", "1", "--steps", "12", "--warmup", "2"],
        "TRL SFT steps/s, trainwright / transformers",
    ),
    "st_train": (
        ["bench/st_train.py", "--repeats", "1", "--steps", "12", "--warmup", "2"],
        "sentence-transformers steps/s, trainwright / transformers",
    ),
    "activations": (
        ["bench/activations.py", "--layers", "1", "--batch", "1", "--seq", "32", "--rounds", "1"],
        "dropout attention time, lean / SDPA",
    ),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_bench_script_runs_and_prints_its_summary(name, tmp_path):
    argv, summary = SCRIPTS[name]
    env = {**os.environ, "BENCH_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{argv[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert summary in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("where", ["in this process", "a fresh process each"])
def test_overhead_rates_alternate_the_order_and_leave_peers_out_when_asked(where):
    argv = ["bench/overhead.py", "--skip", "gpt", "--skip", "peers", "--repeats", "2", "--mlp-steps", "30"]
    argv += ["--fresh"] if where.startswith("a fresh") else []
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SUMMARY trainwright/raw: tiny MLP" in done.stdout and "peers: none" in done.stdout
    assert f"best of 2, {where}" in done.stdout
    assert "transformers.Trainer" not in done.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench/overhead.py", "--mlp-steps", "5"], "--mlp-steps must be > 21"),
        (["bench/mfu.py", "--steps", "5"], "--steps must be >= 20"),
        (["bench/monitor.py", "--mlp-steps", "30"], "--mlp-steps must be >= 110"),
    ],
)
def test_a_run_too_short_to_measure_is_refused_naming_the_flag(argv, message):
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("variant", ["raw", "raw-lean", "trainwright"])
def test_the_unit_count_instructions_times_trains_and_exits_0(variant):
    """`bench/overhead.py --count-instructions` runs `--run-steps VARIANT N` under valgrind (minutes a
    run, so not here): the unit itself trains and exits 0."""
    argv = ["bench/overhead.py", "--run-steps", variant, "30"]
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

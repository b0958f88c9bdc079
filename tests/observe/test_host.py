"""The Trainer's start line says torch's thread count, the usable CPUs and the load, with a hint when
the machine is busier than its CPUs (oversubscribed threads make a CPU run many times slower)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import torch
from conftest import RegressionDataset, RegressionModel
from kit import job_env

from trainwright.loop.trainer import Trainer
from trainwright.observe import host


def test_threads_cpus_and_load_are_read_from_the_host():
    text = host.threads_and_load()
    assert text.startswith(f"threads={torch.get_num_threads()} (CPUs={host.usable_cpus()}, load=")
    assert host.usable_cpus() == len(os.sched_getaffinity(0))
    assert host.load_average() == os.getloadavg()[0]


def test_a_busy_machine_gets_the_hint_only_with_several_threads(monkeypatch):
    monkeypatch.setattr(host, "usable_cpus", lambda: 2)
    monkeypatch.setattr(host, "load_average", lambda: 7.84)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert host.threads_and_load() == (
            "threads=2 (CPUs=2, load=7.84: busier than its CPUs, OMP_NUM_THREADS=1 may run faster)"
        )
        torch.set_num_threads(1)
        assert host.threads_and_load() == "threads=1 (CPUs=2, load=7.84)"
        monkeypatch.setattr(host, "load_average", lambda: None)
        assert host.threads_and_load() == "threads=1 (CPUs=2, load=?)"
    finally:
        torch.set_num_threads(previous)


def test_the_start_line_of_training_says_it(make_args, caplog):
    trainer = Trainer(model=RegressionModel(), args=make_args(max_steps=1), train_dataset=RegressionDataset())
    with caplog.at_level(logging.INFO, logger="trainwright.loop.trainer"):
        trainer.train()
    start = [r.getMessage() for r in caplog.records if "Running training" in r.getMessage()]
    assert len(start) == 1
    assert f"threads={torch.get_num_threads()} (CPUs={host.usable_cpus()}, load=" in start[0]


def test_the_demo_takes_the_cpus_that_are_free(monkeypatch):
    import torch

    from trainwright.app import demo
    from trainwright.observe import host

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(host, "usable_cpus", lambda: 8)
    try:
        monkeypatch.setattr(host, "load_average", lambda: 7.2)
        assert demo.pick_threads() == (1, "8 CPUs, load 7.20: the CPUs that are free")
        assert torch.get_num_threads() == 1
        monkeypatch.setattr(host, "load_average", lambda: 2.6)
        assert demo.pick_threads()[0] == 5 and torch.get_num_threads() == 5
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's word wins
        torch.set_num_threads(3)
        assert demo.pick_threads() == (3, "OMP_NUM_THREADS")
    finally:
        torch.set_num_threads(before)


BUSY_JOB = """
import sys, torch
from conftest import RegressionDataset, RegressionModel
from trainwright import Trainer, TrainingArguments
from trainwright.observe import host

torch.set_num_threads(2)
host.usable_cpus = lambda: 2
for load in (7.23, 0.5):  # busy, then not
    host.load_average = lambda: load
    args = TrainingArguments(output_dir={out!r}, max_steps=1, report_to="none", save_strategy="no",
                             disable_tqdm=True, use_cpu=True)
    Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset()).train()
    print("=== load", load, file=sys.stderr, flush=True)
"""


def test_a_busy_machine_is_a_warning_a_plain_script_shows(tmp_path):
    # a script that configures no logging sees warnings (Python's last-resort handler), not INFO lines
    code = BUSY_JOB.format(out=str(tmp_path / "out"))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=job_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    busy, _, calm = proc.stderr.partition("=== load 7.23")
    warned = [line for line in busy.splitlines() if "busier than its CPUs" in line]
    assert warned == [
        "This machine is busier than its CPUs (load 7.23 on 2 CPUs) and torch runs 2 threads: each waits on "
        "the others at every operation, and a CPU run can be many times slower. Run with OMP_NUM_THREADS=1 "
        "(or torch.set_num_threads(1) first thing), or the number of CPUs that are free (README: Threads "
        "under load)."
    ]
    assert "busier" not in calm and "Running training" not in proc.stderr  # the start line stays INFO

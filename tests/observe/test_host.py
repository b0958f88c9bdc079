"""The Trainer's start line says torch's thread count, the usable CPUs and the load, with a hint when
the machine is busier than its CPUs (oversubscribed threads make a CPU run many times slower)."""

from __future__ import annotations

import logging
import os

import torch
from conftest import RegressionDataset, RegressionModel

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

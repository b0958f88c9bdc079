"""TrainingArguments' process properties: the runtime is asked lazily and delegated to (device,
ranks, should_save / should_log, log levels, main_process_first)."""

import contextlib
import logging

import pytest
import torch
from args_kit import (
    fresh_old_name_warnings,  # noqa: F401  (autouse)
    make,
)

from trainwright.core import runtime as runtime_module
from trainwright.core.enums import ParallelMode


class FakeRuntime(runtime_module.Runtime):
    def __init__(self, rank=0, local_rank=0, world_size=1):
        super().__init__(device=torch.device("cpu"), rank=rank, local_rank=local_rank, world_size=world_size)
        self.entered: list[bool] = []

    @contextlib.contextmanager
    def main_process_first(self, local=True):
        self.entered.append(local)
        yield


@pytest.fixture
def fake_runtime(monkeypatch):
    calls: list[dict] = []
    holder = {"rt": FakeRuntime()}

    def get_runtime(**kwargs):
        calls.append(kwargs)
        return holder["rt"]

    monkeypatch.setattr(runtime_module, "get_runtime", get_runtime)
    return calls, holder


def test_runtime_is_asked_lazily_with_the_arguments(fake_runtime):
    calls, _ = fake_runtime
    a = make(use_cpu=True, ddp_backend="gloo", ddp_timeout=60)
    _ = (a.train_batch_size, a.eval_batch_size, a.to_dict(), str(a))
    assert calls == []  # building and printing the arguments touches no device
    assert a.device == torch.device("cpu")
    assert calls == [{"use_cpu": True, "backend": "gloo", "timeout_s": 60}]
    assert a.n_gpu == 0 and a.world_size == 1 and a.process_index == 0 and a.local_process_index == 0
    assert a.parallel_mode is ParallelMode.NOT_PARALLEL


@pytest.mark.parametrize(
    "rank, local_rank, on_each_node, expected",
    [(0, 0, False, True), (1, 0, False, False), (1, 0, True, True), (1, 1, True, False), (0, 0, True, True)],
)
def test_should_save_and_should_log(fake_runtime, rank, local_rank, on_each_node, expected):
    _, holder = fake_runtime
    holder["rt"] = FakeRuntime(rank=rank, local_rank=local_rank, world_size=4)
    a = make(save_on_each_node=on_each_node, log_on_each_node=on_each_node)
    assert a.should_save is expected and a.should_log is expected
    assert a.world_size == 4 and a.parallel_mode is ParallelMode.DISTRIBUTED


def test_process_log_level(fake_runtime):
    _, holder = fake_runtime
    holder["rt"] = FakeRuntime(rank=1, local_rank=1, world_size=2)
    assert make(log_level="info", log_level_replica="error").get_process_log_level() == logging.ERROR
    holder["rt"] = FakeRuntime()
    assert make(log_level="info").get_process_log_level() == logging.INFO
    # "passive" gives transformers' verbosity, as upstream: INFO after a script's set_verbosity_info().
    hf_logging = pytest.importorskip("transformers.utils.logging")
    old = hf_logging.get_verbosity()
    try:
        hf_logging.set_verbosity_info()
        assert make().get_process_log_level() == logging.INFO
        hf_logging.set_verbosity_warning()
        assert make().get_process_log_level() == logging.WARNING
    finally:
        hf_logging.set_verbosity(old)


def test_main_process_first_delegates_to_runtime(fake_runtime):
    _, holder = fake_runtime
    a = make()
    with a.main_process_first(local=False, desc="tokenize"):
        pass
    with a.main_process_first():
        pass
    assert holder["rt"].entered == [False, True]


def test_main_process_first_with_the_real_single_process_runtime(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    runtime_module.reset_runtime()
    try:
        a = make(use_cpu=True)
        ran = []
        with a.main_process_first():
            ran.append(True)
        assert ran == [True] and a.world_size == 1 and a.should_save and a.device.type == "cpu"
    finally:
        runtime_module.reset_runtime()


def test_place_model_on_device():
    assert make().place_model_on_device is True
    assert make(deepspeed={"zero_optimization": {"stage": 2}}).place_model_on_device is False

"""SpeedMonitor driven through its events with a real LoopCursor / TrainerState / TrainerControl."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from trainwright.callbacks import speed_monitor as sm
from trainwright.callbacks.speed_monitor import SpeedMonitor
from trainwright.core.events import CallbackHandler, TrainerCallback
from trainwright.core.runtime import Runtime
from trainwright.core.state import ExportableState, LoopCursor, TrainerControl, TrainerState

CPU = torch.device("cpu")


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class TwoRankRuntime(Runtime):
    """world_size 2, where the other rank's window deltas are `other` (samples, tokens, flops)."""

    def __init__(self, other: tuple[float, float, float]) -> None:
        super().__init__(device=CPU, world_size=2)
        self.other = other
        self.reductions = 0

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", data_only: bool = False) -> torch.Tensor:
        # over the data-parallel ranks: tensor-parallel peers count the batch they share once
        assert op == "sum" and data_only
        self.reductions += 1
        tensor += torch.tensor(self.other, dtype=tensor.dtype)
        return tensor


class Loop:
    """Drives a SpeedMonitor the way the Trainer does, on a fake clock."""

    def __init__(self, monitor: SpeedMonitor, clock: Clock, args: SimpleNamespace | None = None) -> None:
        self.monitor = monitor
        self.clock = clock
        self.args = args or SimpleNamespace(bf16=False, fp16=False)
        self.state = TrainerState()
        self.control = TrainerControl()
        self.cursor = LoopCursor()

    def kw(self) -> dict:
        return {"model": None, "cursor": self.cursor}

    def begin(self, t: float) -> None:
        self.clock.t = t
        self.monitor.on_train_begin(self.args, self.state, self.control, **self.kw())

    def step(self, t: float, samples: int = 8, tokens: int = 0, flops: float = 0.0) -> None:
        self.cursor.samples_seen += samples
        self.cursor.tokens_seen += tokens
        self.cursor.flops_seen += flops
        self.cursor.steps_applied += 1
        self.clock.t = t
        self.monitor.on_step_end(self.args, self.state, self.control, **self.kw())

    def log(self, t: float, logs: dict | None = None) -> dict:
        logs = {"loss": 1.0, "learning_rate": 0.1} if logs is None else logs
        self.clock.t = t
        self.monitor.on_pre_log(self.args, self.state, self.control, logs=logs, **self.kw())
        return logs

    def evaluate(self, t_end: float, runtime: float, prefix: str = "eval") -> None:
        self.clock.t = t_end
        metrics = {f"{prefix}_loss": 0.5, f"{prefix}_runtime": runtime, f"{prefix}_samples_per_second": 3.0}
        event = self.monitor.on_evaluate if prefix.startswith("eval") else self.monitor.on_predict
        event(self.args, self.state, self.control, metrics=metrics, **self.kw())

    def end(self, t: float) -> None:
        self.clock.t = t
        self.monitor.on_train_end(self.args, self.state, self.control, **self.kw())


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(sm, "_now", c)
    return c


def single(**kw) -> SpeedMonitor:
    kw.setdefault("time_unit", "seconds")
    return SpeedMonitor(runtime=Runtime(device=CPU), **kw)


def test_every_key_is_exact(clock):
    loop = Loop(single(window_size=3, gpu_flops_available=1e9), clock)
    loop.begin(9.0)
    for t in (10.0, 11.0, 13.0, 14.0):
        loop.step(t, samples=8, tokens=128, flops=2e9)
    logs = loop.log(14.5)
    # window: 4 step ends = 3 steps over 14 - 10 = 4 s
    assert logs == {
        "loss": 1.0,
        "learning_rate": 0.1,
        "throughput/batches_per_sec": 3 / 4,
        "throughput/samples_per_sec": 24 / 4,
        "throughput/tokens_per_sec": 384 / 4,
        "throughput/flops_per_sec": 6e9 / 4,
        # one process: the per-device rates are the rates above, logged all the same (a run's keys do
        # not depend on its world size)
        "throughput/device/batches_per_sec": 3 / 4,
        "throughput/device/samples_per_sec": 24 / 4,
        "throughput/device/tokens_per_sec": 384 / 4,
        "throughput/device/flops_per_sec": 6e9 / 4,
        "throughput/device/mfu": 6e9 / 4 / 1e9,
        "time/train": 5.5,
        "time/val": 0.0,
        "time/total": 5.5,
    }


def test_window_rolls_over_the_last_window_size_steps(clock):
    loop = Loop(single(window_size=2), clock)
    loop.begin(0.0)
    loop.step(1.0, samples=4)
    loop.step(2.0, samples=4)
    loop.step(4.0, samples=10)
    logs = loop.log(4.0)
    assert logs["throughput/samples_per_sec"] == (4 + 10) / (4.0 - 1.0)
    loop.step(10.0, samples=12)  # the step ending at 1.0 leaves the window
    logs = loop.log(10.0)
    assert logs["throughput/batches_per_sec"] == 2 / (10.0 - 2.0)
    assert logs["throughput/samples_per_sec"] == (10 + 12) / (10.0 - 2.0)


def test_rates_wait_for_a_full_window_as_composer(clock):
    # Composer's SpeedMonitor keeps window_size + 1 batch ends and logs rates once it has them all.
    loop = Loop(single(window_size=3), clock)
    loop.begin(0.0)
    for t in (1.0, 2.0, 3.0):  # step window_size: the window spans only 2 steps
        loop.step(t)
        logs = loop.log(t)
        assert not any(k.startswith("throughput/") for k in logs)
        assert logs["time/train"] == t
    loop.step(5.0, samples=6)  # step window_size + 1: 3 steps between the ends of steps 1 and 4
    logs = loop.log(5.0)
    assert logs["throughput/batches_per_sec"] == 3 / 4.0
    assert logs["throughput/samples_per_sec"] == (8 + 8 + 6) / 4.0


def test_optional_keys_need_tokens_flops_and_a_peak(clock, caplog):
    caplog.set_level(logging.INFO, logger="trainwright.callbacks.speed_monitor")
    loop = Loop(single(window_size=1), clock)  # CPU, no gpu_flops_available: MFU is off
    loop.begin(0.0)
    assert loop.monitor.peak_flops is None
    assert "no MFU on cpu" in caplog.text
    loop.step(1.0, flops=5e9)
    loop.step(2.0, flops=5e9)
    logs = loop.log(2.0)
    assert logs["throughput/flops_per_sec"] == 5e9
    assert "throughput/device/mfu" not in logs
    assert "throughput/tokens_per_sec" not in logs and "throughput/device/tokens_per_sec" not in logs

    loop = Loop(single(window_size=1, gpu_flops_available=1e10), clock)
    loop.begin(0.0)
    assert "MFU against 0.01 TFLOP/s (gpu_flops_available)" in caplog.text
    loop.step(1.0)
    loop.step(2.0)
    logs = loop.log(2.0)
    assert not any("flops" in k or "mfu" in k for k in logs)  # no FLOPs counted: no flops keys


def test_sum_over_processes_and_per_device_division(clock):
    runtime = TwoRankRuntime(other=(40.0, 400.0, 4e9))
    monitor = SpeedMonitor(window_size=2, gpu_flops_available=1e9, time_unit="seconds", runtime=runtime)
    loop = Loop(monitor, clock)
    loop.begin(0.0)
    loop.step(0.0)
    assert runtime.reductions == 0  # nothing collective outside logging
    for t in (1.0, 2.0):
        loop.step(t, samples=8, tokens=64, flops=1e9)
    logs = loop.log(2.0)
    assert runtime.reductions == 1
    assert logs["throughput/batches_per_sec"] == 1.0  # steps are global: not summed
    assert logs["throughput/samples_per_sec"] == (16 + 40) / 2
    assert logs["throughput/tokens_per_sec"] == (128 + 400) / 2
    assert logs["throughput/flops_per_sec"] == (2e9 + 4e9) / 2
    assert logs["throughput/device/batches_per_sec"] == 0.5
    assert logs["throughput/device/samples_per_sec"] == (16 + 40) / 2 / 2
    assert logs["throughput/device/tokens_per_sec"] == (128 + 400) / 2 / 2
    assert logs["throughput/device/flops_per_sec"] == 6e9 / 2 / 2
    assert logs["throughput/device/mfu"] == 6e9 / 2 / 2 / 1e9


@pytest.mark.parametrize("unit, divider", [("seconds", 1), ("minutes", 60), ("hours", 3600), ("days", 86400)])
def test_time_unit(clock, unit, divider):
    loop = Loop(single(time_unit=unit), clock)
    loop.begin(0.0)
    loop.step(3600.0)
    loop.evaluate(3600.0 + 1800.0, runtime=1800.0)
    loop.step(9000.0)
    logs = loop.log(9000.0)
    assert logs["time/train"] == 7200.0 / divider
    assert logs["time/val"] == 1800.0 / divider
    assert logs["time/total"] == 9000.0 / divider


def test_evaluation_is_excluded_from_the_window_and_reported_as_val(clock):
    loop = Loop(single(window_size=2), clock)
    loop.begin(0.0)
    loop.step(1.0, samples=10)
    loop.step(2.0, samples=10)
    eval_row = {"eval_loss": 0.5}
    assert loop.log(2.0, eval_row) == {"eval_loss": 0.5}  # only training rows get keys
    loop.evaluate(102.0, runtime=100.0)
    loop.step(103.0, samples=10)
    logs = loop.log(103.0)
    # from the step end at 1.0 to the one at 103.0: 2 training seconds, not 102
    assert logs["throughput/samples_per_sec"] == 20 / 2.0
    assert logs["throughput/batches_per_sec"] == 2 / 2.0
    assert logs["time/train"] == 3.0
    assert logs["time/val"] == 100.0
    assert logs["time/total"] == 103.0
    loop.evaluate(110.0, runtime=5.0, prefix="test")  # predict() counts as evaluation time too
    loop.step(111.0, samples=10)
    logs = loop.log(111.0)
    assert logs["time/val"] == 105.0
    # the window now starts at the step end at 2.0: 20 samples in (111 - 105) - 2 training seconds
    assert logs["throughput/samples_per_sec"] == 20 / (111.0 - 105.0 - 2.0)


def test_evaluation_without_a_runtime_metric_warns_once(clock, caplog):
    caplog.set_level(logging.WARNING, logger="trainwright.callbacks.speed_monitor")
    loop = Loop(single(), clock)
    loop.begin(0.0)
    for _ in range(2):
        loop.monitor.on_evaluate(loop.args, loop.state, loop.control, metrics={"eval_loss": 1.0}, **loop.kw())
    assert caplog.text.count("no '*_runtime' value") == 1
    assert loop.monitor.total_eval_time == 0.0


def test_times_survive_a_resume_through_state(clock):
    loop = Loop(single(window_size=4, gpu_flops_available=2e12), clock)
    loop.begin(100.0)
    loop.step(101.0)
    loop.evaluate(111.0, runtime=10.0)
    loop.step(112.0)
    clock.t = 112.0
    saved = json.loads(json.dumps(loop.monitor.state()))  # what trainer_state.json holds
    assert saved == {
        "args": {"window_size": 4, "gpu_flops_available": 2e12, "time_unit": "seconds"},
        "attributes": {"total_eval_time": 10.0, "total_train_time": 2.0},
    }
    assert isinstance(loop.monitor, ExportableState)

    resumed = SpeedMonitor.from_state(saved)
    assert (resumed.window_size, resumed.gpu_flops_available, resumed.time_unit) == (4, 2e12, "seconds")
    resumed._runtime = Runtime(device=CPU)
    loop2 = Loop(resumed, clock)
    loop2.begin(500.0)
    loop2.step(501.0)
    logs = loop2.log(503.0)
    assert not any(k.startswith("throughput/") for k in logs)  # the window restarts empty
    assert logs["time/train"] == 2.0 + 3.0
    assert logs["time/val"] == 10.0
    loop2.end(504.0)
    assert resumed.state()["attributes"]["total_train_time"] == 6.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"time_unit": "weeks"},
            "time_unit must be one of \\['seconds', 'minutes', 'hours', 'days'\\], got 'weeks'",
        ),
        ({"window_size": 0}, "window_size must be an int >= 1, got 0"),
        ({"window_size": 2.5}, "window_size must be an int >= 1"),
        ({"gpu_flops_available": -1.0}, "gpu_flops_available must be a positive number"),
        ({"gpu_flops_available": "312e12"}, "gpu_flops_available must be a positive number"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeedMonitor(**kwargs)


def test_defaults_match_composer_and_the_trainer_is_asked_for_flops():
    monitor = SpeedMonitor()
    assert (monitor.window_size, monitor.gpu_flops_available, monitor.time_unit) == (100, None, "hours")
    assert isinstance(monitor, TrainerCallback)
    assert monitor.needs_flops is True  # the Trainer counts tokens/FLOPs only when a callback asks


def test_events_arrive_through_the_callback_handler(clock):
    monitor = single(window_size=2)
    handler = CallbackHandler([monitor], model=None, processing_class=None, optimizer=None, lr_scheduler=None)
    cursor = LoopCursor()
    handler.cursor = cursor
    args, state, control = SimpleNamespace(bf16=False, fp16=False), TrainerState(), TrainerControl()
    handler.on_train_begin(args, state, control)
    for t in (1.0, 2.0, 3.0):
        cursor.samples_seen += 5
        clock.t = t
        handler.on_step_end(args, state, control)
    clock.t = 3.0
    logs = {"loss": 2.0}
    handler.on_pre_log(args, state, control, logs=logs)
    assert logs["throughput/samples_per_sec"] == 5.0
    handler.on_evaluate(args, state, control, metrics={"eval_runtime": 4.0})
    assert monitor.total_eval_time == 4.0


class _RecordTorchCalls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_step_end_does_no_tensor_work():
    monitor = single(window_size=100)
    loop = Loop(monitor, Clock())
    loop.begin(0.0)
    args, state, control, cursor = loop.args, loop.state, loop.control, loop.cursor
    with _RecordTorchCalls() as recorder:
        for _ in range(1000):
            cursor.samples_seen += 8
            monitor.on_step_end(args, state, control, model=None, cursor=cursor)
    assert recorder.calls == []
    assert len(monitor._window) == 101
    n = 100_000
    started = time.perf_counter()
    for _ in range(n):
        monitor.on_step_end(args, state, control, model=None, cursor=cursor)
    print(f"SpeedMonitor.on_step_end: {(time.perf_counter() - started) / n * 1e9:.0f} ns per call")


def _two_process_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        clock = Clock()
        sm._now = clock
        runtime = Runtime(device=CPU, rank=rank, world_size=2, backend="gloo")
        loop = Loop(SpeedMonitor(window_size=2, time_unit="seconds", runtime=runtime), clock)
        loop.begin(0.0)
        for t in (1.0, 2.0, 3.0):
            loop.step(t, samples=8 if rank == 0 else 4, tokens=0, flops=1e6 * (rank + 1))
        logs = loop.log(3.0)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(logs, f)
    finally:
        dist.destroy_process_group()


def test_real_all_reduce_across_two_processes(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_two_process_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        logs = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert logs["throughput/samples_per_sec"] == (16 + 8) / 2.0
        assert logs["throughput/device/samples_per_sec"] == (16 + 8) / 2.0 / 2
        assert logs["throughput/flops_per_sec"] == (2e6 + 4e6) / 2.0
        assert "throughput/tokens_per_sec" not in logs


@pytest.mark.parametrize(
    "name, precision, expected",
    [
        ("NVIDIA H100 80GB HBM3", {"bf16": True}, 989.5e12),
        ("NVIDIA H100 PCIe", {"fp16": True}, 756.5e12),
        ("NVIDIA A100-SXM4-80GB", {}, 19.5e12),  # fp32 with TF32 off ("highest")
        ("NVIDIA GH200 480GB", {"bf16": True}, None),  # unknown: no MFU, never a guess
    ],
)
def test_peak_is_looked_up_from_the_cuda_device_and_training_dtype(
    monkeypatch, caplog, name, precision, expected
):
    # No GPU here: only the device-name query is stood in for; the lookup itself is real.
    caplog.set_level(logging.INFO, logger="trainwright.callbacks.speed_monitor")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        monitor = SpeedMonitor(runtime=Runtime(device=torch.device("cuda", 0)))
        args = SimpleNamespace(**{"bf16": False, "fp16": False, **precision})
        monitor.on_train_begin(args, TrainerState(), TrainerControl(), cursor=LoopCursor())
    finally:
        torch.set_float32_matmul_precision(before)
    assert monitor.peak_flops == expected
    assert repr(name) in caplog.text
    assert ("MFU is off" in caplog.text) == (expected is None)

"""TrainerMemoryTracker: exact CPU peaks from the kernel's high-water mark, and the fallback."""

from __future__ import annotations

import logging
import sys
import threading

import pytest
import torch
from observe_kit import touched_buffer

from trainwright.observe import memory
from trainwright.observe.memory import TrainerMemoryTracker

MB = 2**20
SIZE = 200 * MB

needs_clear_refs = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not memory._reset_peak_rss(),
    reason="needs a writable /proc/self/clear_refs (Linux)",
)


def _cpu_keys(metrics: dict, stage: str) -> tuple[int, int]:
    return metrics[f"{stage}_mem_cpu_alloc_delta"], metrics[f"{stage}_mem_cpu_peaked_delta"]


@needs_clear_refs
def test_freed_temporary_buffer_shows_as_exact_peak(caplog):
    caplog.set_level(logging.INFO, logger="trainwright.observe.memory")
    memory._logged_methods.clear()
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    assert tracker.cpu_peak_method == "vmhwm"
    assert "VmHWM" in caplog.text
    tracker.start("train")
    assert tracker._sampler is None  # no thread on this path
    buf = touched_buffer(SIZE)
    del buf
    metrics: dict = {}
    tracker.stop_and_update_metrics("train", metrics)
    alloc, peaked = _cpu_keys(metrics, "train")
    assert abs(peaked - SIZE) < 0.03 * SIZE
    assert abs(alloc) < 0.03 * SIZE
    assert not any("gpu" in k for k in metrics)  # no CUDA here: gpu keys are omitted


@needs_clear_refs
def test_buffer_kept_alive_shows_as_alloc_delta():
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    tracker.start("eval")
    kept = touched_buffer(SIZE)
    metrics: dict = {}
    tracker.stop_and_update_metrics("eval", metrics)
    alloc, peaked = _cpu_keys(metrics, "eval")
    assert abs(alloc - SIZE) < 0.03 * SIZE
    assert 0 <= peaked < 0.03 * SIZE
    del kept


@needs_clear_refs
def test_peak_is_reset_at_each_stage_start():
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    tracker.start("train")
    del_me = touched_buffer(SIZE)
    del del_me
    tracker.stop("train")
    tracker.start("eval")  # the earlier 200 MB peak must not leak into this stage
    metrics: dict = {}
    tracker.stop_and_update_metrics("eval", metrics)
    assert metrics["eval_mem_cpu_peaked_delta"] < 0.03 * SIZE


def test_nested_stage_is_ignored_and_does_not_corrupt_the_outer_one():
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    tracker.start("train")
    kept = touched_buffer(SIZE // 4)
    tracker.start("eval")  # evaluation inside training
    inner = touched_buffer(SIZE // 2)
    nested: dict = {}
    tracker.stop_and_update_metrics("eval", nested)
    assert nested == {}
    assert "eval" not in tracker.cpu
    assert tracker.cur_stage == "train"
    del inner
    metrics: dict = {}
    tracker.stop_and_update_metrics("train", metrics)
    alloc, peaked = _cpu_keys(metrics, "train")
    assert abs(alloc - SIZE // 4) < 0.05 * SIZE
    if tracker.cpu_peak_method == "vmhwm":  # the eval buffer's peak belongs to train
        assert abs(peaked - SIZE // 2) < 0.05 * SIZE
    assert not any(k.startswith("eval_") for k in metrics)
    del kept


def test_init_is_reported_once_with_the_first_stage():
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    tracker.start("init")
    tracker.stop("init")
    tracker.start("train")
    first: dict = {}
    tracker.stop_and_update_metrics("train", first)
    assert set(first) == {
        "init_mem_cpu_alloc_delta",
        "init_mem_cpu_peaked_delta",
        "train_mem_cpu_alloc_delta",
        "train_mem_cpu_peaked_delta",
        "before_init_mem_cpu",
    }
    assert first["before_init_mem_cpu"] == tracker.cpu["init"]["begin"] > 0
    tracker.start("test")
    second: dict = {}
    tracker.stop_and_update_metrics("test", second)
    assert set(second) == {"test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"}


def test_skipped_tracker_does_nothing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a skipped tracker must not measure anything")

    monkeypatch.setattr(memory, "_reset_peak_rss", fail)
    monkeypatch.setattr(memory, "_read_status_kb", fail)
    monkeypatch.setattr(memory, "_current_rss", fail)
    monkeypatch.setattr(memory.gc, "collect", fail)
    threads = threading.active_count()
    tracker = TrainerMemoryTracker()  # skip_memory_metrics defaults to True
    metrics = {"loss": 1.0}
    tracker.start("train")
    tracker.stop("train")
    tracker.update_metrics("train", metrics)
    tracker.stop_and_update_metrics("train", metrics)
    assert metrics == {"loss": 1.0}
    assert tracker.cpu_peak_method is None
    assert threading.active_count() == threads


def test_sampling_fallback_catches_a_buffer_held_for_a_while(monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainwright.observe.memory")
    memory._logged_methods.clear()
    # the same failure as a kernel without clear_refs or a sandbox that forbids it
    monkeypatch.setattr(memory, "_CLEAR_REFS", str(tmp_path / "missing" / "clear_refs"))
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    assert tracker.cpu_peak_method == "sampling"
    assert "sampling thread" in caplog.text
    tracker.start("train")
    sampler = tracker._sampler
    assert sampler is not None and sampler.is_alive()
    buf = touched_buffer(SIZE)
    assert sampler.wait_for_samples(2, timeout=30)  # held while the sampler looks twice
    del buf
    metrics: dict = {}
    tracker.stop_and_update_metrics("train", metrics)
    assert not sampler.is_alive()
    alloc, peaked = _cpu_keys(metrics, "train")
    assert abs(peaked - SIZE) < 0.05 * SIZE
    assert abs(alloc) < 0.05 * SIZE


def test_bad_stage_is_rejected():
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    with pytest.raises(
        ValueError, match=r"stage must be one of \('init', 'train', 'eval', 'test'\), got 'training'"
    ):
        tracker.start("training")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_keys_from_the_allocator():
    device = torch.device("cuda", torch.cuda.current_device())
    tracker = TrainerMemoryTracker(skip_memory_metrics=False, device=device)
    tracker.start("train")
    kept = torch.ones(SIZE // 4, dtype=torch.uint8, device=device)
    temp = torch.ones(SIZE, dtype=torch.uint8, device=device)
    del temp
    metrics: dict = {}
    tracker.stop_and_update_metrics("train", metrics)
    assert metrics["train_mem_gpu_alloc_delta"] == SIZE // 4
    assert metrics["train_mem_gpu_peaked_delta"] == SIZE
    del kept

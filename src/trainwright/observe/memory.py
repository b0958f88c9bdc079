"""Memory tracker behind the ``{stage}_mem_*`` metrics of train / evaluate / predict.

Keys (bytes): ``{stage}_mem_cpu_alloc_delta``, ``{stage}_mem_cpu_peaked_delta`` and, on CUDA,
``{stage}_mem_gpu_alloc_delta``, ``{stage}_mem_gpu_peaked_delta`` for stage in init / train / eval /
test, plus ``before_init_mem_cpu`` / ``before_init_mem_gpu`` with the first report that includes
init. ``alloc_delta`` = end - begin (may be negative); ``peaked_delta`` = max(0, peak - end): their
sum is the memory the stage needed on top of what it started with.

CPU peak, exactly and without a thread on Linux: each stage starts by resetting the process's
resident-set high-water mark (writing "5" to ``/proc/self/clear_refs``, Linux >= 4.0) and ends by
reading it (``VmHWM`` in ``/proc/self/status``). Where that reset is unavailable (not Linux, kernel
without ``CONFIG_PROC_PAGE_MONITOR``, sandboxes that forbid it) a thread samples the RSS every
millisecond instead, which can miss short peaks. ``cpu_peak_method`` says which is in use.

Limits: figures are for this process only (DataLoader worker processes are not included), RSS
counts shared pages once touched, and memory the C allocator hands out again from pages it kept
resident (freed chunks inside the heap, common after a long session) does not move the RSS; GPU
figures are the PyTorch caching allocator's counters of the tracked device (not the CUDA context or
other libraries' memory). Both the RSS high-water mark and ``torch.cuda`` peak counter are
process-global: another tool that resets them during a stage
corrupts the numbers, and this tracker resets them at each stage start (so a whole-run peak read
elsewhere, e.g. from ``ru_maxrss``, is lost). Stages do not nest: a stage started while another
runs (evaluation inside training) is ignored, and its memory is part of the outer stage.
"""

from __future__ import annotations

import gc
import logging
import threading

import torch

logger = logging.getLogger(__name__)

STAGES = ("init", "train", "eval", "test")

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"
_SAMPLE_INTERVAL_S = 0.001
_logged_methods: set[str] = set()


def _read_status_kb(*fields: str) -> dict[str, int]:
    """Selected ``kB`` fields of /proc/self/status, in bytes."""
    wanted = set(fields)
    out: dict[str, int] = {}
    with open(_STATUS, encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in wanted:
                out[name] = int(rest.split()[0]) * 1024
    return out


def _reset_peak_rss() -> bool:
    """Reset the process's RSS high-water mark to its current RSS; False where impossible."""
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as f:
            f.write("5")
        return len(_read_status_kb("VmHWM", "VmRSS")) == 2
    except (OSError, ValueError, IndexError):
        return False


def _current_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class _RssSampler(threading.Thread):
    """Fallback: records the highest RSS seen, sampling every `_SAMPLE_INTERVAL_S`."""

    def __init__(self) -> None:
        super().__init__(name="trainwright-rss-sampler", daemon=True)
        self.peak = _current_rss()
        self.samples = 0
        self._stop_event = threading.Event()
        self._sampled = threading.Condition()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss = _current_rss()
            with self._sampled:
                self.peak = max(self.peak, rss)
                self.samples += 1
                self._sampled.notify_all()
            self._stop_event.wait(_SAMPLE_INTERVAL_S)

    def wait_for_samples(self, count: int, timeout: float) -> bool:
        """Block until `count` more samples were taken (True) or `timeout` seconds passed."""
        with self._sampled:
            target = self.samples + count
            return self._sampled.wait_for(lambda: self.samples >= target, timeout)

    def finish(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, _current_rss())


class TrainerMemoryTracker:
    """Per-stage CPU and GPU memory deltas; every method is a no-op when `skip_memory_metrics`.

    Usage: ``start("train")`` ... ``stop_and_update_metrics("train", metrics)``. The stage is
    given explicitly (one of init, train, eval, test). `device` is the accelerator whose allocator
    is read; by default the current CUDA device when CUDA is available. Without CUDA the gpu keys
    are omitted.
    """

    def __init__(self, skip_memory_metrics: bool = True, device: torch.device | str | None = None) -> None:
        self.skip_memory_metrics = skip_memory_metrics
        self.cpu_peak_method: str | None = None
        self.device: torch.device | None = None
        if skip_memory_metrics:
            return
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.device = torch.device(device) if device is not None else None
        self.cur_stage: str | None = None
        self.cpu: dict[str, dict[str, int]] = {}
        self.gpu: dict[str, dict[str, int]] = {}
        self.init_reported = False
        self._sampler: _RssSampler | None = None
        self._cpu_begin = 0
        self._gpu_begin = 0
        self.cpu_peak_method = "vmhwm" if _reset_peak_rss() else "sampling"
        if self.cpu_peak_method not in _logged_methods:
            _logged_methods.add(self.cpu_peak_method)
            logger.info(
                "Memory metrics: CPU peak from %s",
                "the kernel's RSS high-water mark (VmHWM, reset per stage)"
                if self.cpu_peak_method == "vmhwm"
                else "a 1 ms RSS sampling thread (/proc/self/clear_refs unavailable; short peaks may be missed)",
            )

    @property
    def _tracks_gpu(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    @staticmethod
    def _check_stage(stage: str) -> None:
        if stage not in STAGES:
            raise ValueError(f"TrainerMemoryTracker: stage must be one of {STAGES}, got {stage!r}")

    def start(self, stage: str) -> None:
        """Begin tracking `stage`; ignored while another stage is being tracked."""
        if self.skip_memory_metrics:
            return
        self._check_stage(stage)
        if self.cur_stage is not None:
            return
        self.cur_stage = stage
        gc.collect()
        if self._tracks_gpu:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._gpu_begin = torch.cuda.memory_allocated(self.device)
        if self.cpu_peak_method == "vmhwm" and _reset_peak_rss():
            self._cpu_begin = _read_status_kb("VmRSS")["VmRSS"]
        else:
            self.cpu_peak_method = "sampling"
            self._cpu_begin = _current_rss()
            self._sampler = _RssSampler()
            self._sampler.start()

    def stop(self, stage: str) -> None:
        """End tracking `stage` and store its figures; ignored for a stage that is not the current one."""
        if self.skip_memory_metrics:
            return
        self._check_stage(stage)
        if self.cur_stage != stage:
            return
        gc.collect()
        if self._tracks_gpu:
            end = torch.cuda.memory_allocated(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self.gpu[stage] = self._figures(self._gpu_begin, end, peak)
        if self._sampler is not None:
            peak = self._sampler.finish()
            self._sampler = None
            end = _current_rss()
        else:
            status = _read_status_kb("VmRSS", "VmHWM")
            end, peak = status["VmRSS"], status["VmHWM"]
        self.cpu[stage] = self._figures(self._cpu_begin, end, peak)
        self.cur_stage = None

    @staticmethod
    def _figures(begin: int, end: int, peak: int) -> dict[str, int]:
        return {"begin": begin, "end": end, "alloc": end - begin, "peaked": max(0, peak - end)}

    def update_metrics(self, stage: str, metrics: dict) -> None:
        """Add the memory keys of `stage` (and of init, the first time) to `metrics` in place."""
        if self.skip_memory_metrics:
            return
        self._check_stage(stage)
        if self.cur_stage is not None and self.cur_stage != stage:
            return
        stages = [stage]
        if not self.init_reported and stage != "init" and "init" in self.cpu:
            stages.insert(0, "init")
        for s in stages:
            for kind, table in (("cpu", self.cpu), ("gpu", self.gpu)):
                if s in table:
                    metrics[f"{s}_mem_{kind}_alloc_delta"] = table[s]["alloc"]
                    metrics[f"{s}_mem_{kind}_peaked_delta"] = table[s]["peaked"]
        if "init" in stages and "init" in self.cpu:
            self.init_reported = True
            metrics["before_init_mem_cpu"] = self.cpu["init"]["begin"]
            if "init" in self.gpu:
                metrics["before_init_mem_gpu"] = self.gpu["init"]["begin"]

    def stop_and_update_metrics(self, stage: str, metrics: dict | None = None) -> None:
        """`stop(stage)`, then `update_metrics(stage, metrics)` when metrics is given."""
        if self.skip_memory_metrics:
            return
        self.stop(stage)
        if metrics is not None:
            self.update_metrics(stage, metrics)

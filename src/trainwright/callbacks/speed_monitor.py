"""SpeedMonitor: windowed throughput, MFU and wall-clock time, with Composer's metric keys.

Keys added to each training log row (a row with "loss"):

=====================================  =============================================================
``throughput/batches_per_sec``         optimizer steps in the window / window seconds
``throughput/samples_per_sec``         samples of all processes in the window / window seconds
``throughput/tokens_per_sec``          same for tokens (only when the batches carry tokens)
``throughput/flops_per_sec``           same for FLOPs (only when the Trainer counts FLOPs)
``throughput/device/<x>_per_sec``      each of the above / world size (with one process: the same)
``throughput/device/mfu``              device FLOP/s / the device's dense peak (when known)
``time/train``                         training wall time, evaluation excluded, across resumes
``time/val``                           wall time of evaluate() and predict() calls
``time/total``                         time/train + time/val
=====================================  =============================================================

Every key is logged at every world size, as Composer's, so a run's keys do not depend on its number
of processes (dashboards compare a 1-GPU run with an 8-GPU one); the console line leaves out a
per-device rate that repeats the whole run's (`format_logs`).

Times are in `time_unit`. The window holds the last `window_size` optimizer steps ("batches" are
optimizer steps, each possibly several accumulated micro-batches), measured between the ends of
`window_size + 1` steps. As in Composer, rates appear only once the window is full: the first row
with throughput keys is the first one logged at or after step `window_size + 1` of this run (a
resumed run starts an empty window); rows before it carry only the time/* keys. Pick `window_size`
below `logging_steps` for a rate on every row.

Inputs: the Trainer's `cursor` (a `LoopCursor`) holds this process's cumulative samples, tokens
and FLOPs. `on_step_end` only copies them with a timestamp into a bounded deque (no tensor work,
no device sync). At log time the window's deltas are summed over processes with one all-reduce,
so `on_pre_log` must be fired on every process. Timestamps are host time: on an accelerator they
are meaningful because the Trainer syncs at log time (reading the loss), and a window spans many
steps.

Evaluation time is taken from the Trainer's own measure of each evaluate()/predict() call (the
`*_runtime` value in the metrics given to `on_evaluate` / `on_predict`), added to time/val and
removed from the training clock, so the window's rates exclude it as Composer's do.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import torch

from trainwright.core.events import TrainerCallback
from trainwright.core.runtime import Runtime, get_runtime
from trainwright.observe import flops

logger = logging.getLogger(__name__)

_now = time.perf_counter

TIME_UNITS = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


class SpeedMonitor(TrainerCallback):
    """Throughput and MFU over a rolling window of optimizer steps, plus train/eval wall time.

    Args:
        window_size: number of optimizer steps the rates are averaged over.
        gpu_flops_available: peak FLOP/s of one device for MFU; by default looked up from the
            device name and training dtype in `trainwright.observe.flops.PEAK_FLOPS` (no MFU when the
            device is unknown, e.g. on CPU).
        time_unit: unit of the time/* keys: seconds, minutes, hours or days.
        runtime: the process runtime (for the cross-process sum); default `get_runtime()`.
    """

    # Tells the Trainer to count tokens and FLOPs per batch into the cursor (it skips that work
    # when no callback needs it).
    needs_flops = True
    _STATE_ATTRIBUTES = ("total_eval_time", "total_train_time")

    def __init__(
        self,
        window_size: int = 100,
        gpu_flops_available: float | None = None,
        time_unit: str = "hours",
        *,
        runtime: Runtime | None = None,
    ) -> None:
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f"SpeedMonitor: window_size must be an int >= 1, got {window_size!r}")
        if gpu_flops_available is not None and (
            isinstance(gpu_flops_available, bool)
            or not isinstance(gpu_flops_available, (int, float))
            or not gpu_flops_available > 0
        ):
            raise ValueError(
                f"SpeedMonitor: gpu_flops_available must be a positive number of FLOP/s or None, "
                f"got {gpu_flops_available!r}"
            )
        if time_unit not in TIME_UNITS:
            raise ValueError(f"SpeedMonitor: time_unit must be one of {list(TIME_UNITS)}, got {time_unit!r}")
        self.window_size = window_size
        self.gpu_flops_available = gpu_flops_available
        self.time_unit = time_unit
        self._divider = TIME_UNITS[time_unit]
        self._runtime = runtime
        # (training clock, samples, tokens, flops) at the end of each of the last window_size + 1 steps
        self._window: deque[tuple[float, int, int, float]] = deque(maxlen=window_size + 1)
        self.peak_flops: float | None = gpu_flops_available
        # Saved in checkpoints (see state()): seconds of evaluation and of training so far.
        self.total_eval_time = 0.0
        self.total_train_time = 0.0
        self._train_start: float | None = None
        self._eval_at_train_start = 0.0
        self._warned_no_runtime = False  # warn once if evaluation metrics lack a runtime

    # -- checkpoint state -------------------------------------------------------------------
    def state(self) -> dict:
        """Constructor args and the accumulated times, for trainer_state.json."""
        return {
            "args": {
                "window_size": self.window_size,
                "gpu_flops_available": self.gpu_flops_available,
                "time_unit": self.time_unit,
            },
            "attributes": {
                "total_eval_time": self.total_eval_time,
                "total_train_time": self._train_time(_now()),
            },
        }

    @classmethod
    def from_state(cls, state: dict) -> SpeedMonitor:
        """A monitor rebuilt from `state()`'s output."""
        monitor = cls(**state.get("args", {}))
        attributes = state.get("attributes", {})
        for name in cls._STATE_ATTRIBUTES:
            if name in attributes:
                setattr(monitor, name, float(attributes[name]))
        return monitor

    # -- clocks -------------------------------------------------------------------------------
    def _train_time(self, now: float) -> float:
        if self._train_start is None:
            return self.total_train_time
        evaluating = self.total_eval_time - self._eval_at_train_start
        return self.total_train_time + (now - self._train_start) - evaluating

    def _training_clock(self) -> float:
        """Host clock minus all evaluation time so far: differences between step ends are training time."""
        return _now() - self.total_eval_time

    # -- events -------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._window.clear()
        self._train_start = _now()
        self._eval_at_train_start = self.total_eval_time
        if self._runtime is None:
            self._runtime = get_runtime()
        if self.gpu_flops_available:
            self.peak_flops = self.gpu_flops_available
            logger.info("SpeedMonitor: MFU against %g TFLOP/s (gpu_flops_available)", self.peak_flops / 1e12)
        else:
            self.peak_flops = self._lookup_peak(args)

    def _lookup_peak(self, args: Any) -> float | None:
        assert self._runtime is not None  # on_train_begin sets it before asking
        device = self._runtime.device
        if device.type != "cuda":
            logger.info(
                "SpeedMonitor: no MFU on %s (pass gpu_flops_available=<peak FLOP/s> to enable it)",
                device.type,
            )
            return None
        if getattr(args, "bf16", False):
            dtype = torch.bfloat16
        elif getattr(args, "fp16", False):
            dtype = torch.float16
        else:
            dtype = torch.float32
        name = torch.cuda.get_device_name(device)
        peak = flops.get_peak_flops(name, dtype)
        if peak is None:
            logger.warning(
                "SpeedMonitor: no known dense peak for %r in %s: MFU is off "
                "(pass gpu_flops_available=<peak FLOP/s> to enable it)",
                name,
                dtype,
            )
        else:
            tf32 = " (TF32 allowed)" if dtype == torch.float32 and flops.tf32_enabled() else ""
            logger.info(
                "SpeedMonitor: MFU against %g TFLOP/s, the dense peak of %r in %s%s",
                peak / 1e12,
                name,
                dtype,
                tf32,
            )
        return peak

    def on_train_end(self, args, state, control, **kwargs):
        self.total_train_time = self._train_time(_now())
        self._train_start = None

    def on_step_end(self, args, state, control, cursor=None, **kwargs):
        # Hot path: one tuple appended, no tensor work.
        self._window.append(
            (self._training_clock(), cursor.samples_seen, cursor.tokens_seen, cursor.flops_seen)
        )

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._add_eval_time(metrics)

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self._add_eval_time(metrics)

    def _add_eval_time(self, metrics: dict | None) -> None:
        runtimes = [
            v for k, v in (metrics or {}).items() if k.endswith("_runtime") and isinstance(v, (int, float))
        ]
        if not runtimes:
            if not self._warned_no_runtime:
                self._warned_no_runtime = True
                logger.warning(
                    "SpeedMonitor: evaluation metrics have no '*_runtime' value; its time is not excluded "
                    "from training throughput nor counted in time/val"
                )
            return
        self.total_eval_time += float(sum(runtimes))

    def on_pre_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        now = _now()
        window = self._window
        if len(window) == window.maxlen:  # a full window only, as Composer
            self._add_rates(logs, window[0], window[-1], len(window) - 1)
        train = self._train_time(now)
        logs["time/train"] = train / self._divider
        logs["time/val"] = self.total_eval_time / self._divider
        logs["time/total"] = (train + self.total_eval_time) / self._divider

    def _add_rates(self, logs: dict, first: tuple, last: tuple, steps: int) -> None:
        if self._runtime is None:
            self._runtime = get_runtime()
        runtime = self._runtime
        samples, tokens, flop_count = last[1] - first[1], last[2] - first[2], last[3] - first[3]
        world_size = runtime.world_size
        if runtime.distributed:
            totals = torch.tensor([samples, tokens, flop_count], dtype=torch.float64, device=runtime.device)
            # peers sharing a batch (tensor parallel) counted it once: summed over data-parallel ranks
            samples, tokens, flop_count = runtime.all_reduce(totals, "sum", data_only=True).tolist()
        elapsed = last[0] - first[0]
        if elapsed <= 0:
            return
        rates = {"batches": steps / elapsed, "samples": samples / elapsed}
        if tokens > 0:
            rates["tokens"] = tokens / elapsed
        if flop_count > 0:
            rates["flops"] = flop_count / elapsed
        for name, rate in rates.items():
            logs[f"throughput/{name}_per_sec"] = rate
        for name, rate in rates.items():  # with one process the same values: the keys stay
            logs[f"throughput/device/{name}_per_sec"] = rate / world_size
        if "flops" in rates and self.peak_flops:
            logs["throughput/device/mfu"] = rates["flops"] / world_size / self.peak_flops

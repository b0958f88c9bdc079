"""Result types, metric formatting and files, and speed metrics.

Everything here is a module function or a small class: the Trainer exposes `log_metrics`,
`metrics_format`, `save_metrics` and `save_state` as thin methods over these.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from trainwright.core.files import JSONFileError, read_json_object, write_json
from trainwright.core.state import TrainerState

# -- result types --------------------------------------------------------------------------


class TrainOutput(NamedTuple):
    """What `Trainer.train` returns."""

    global_step: int
    training_loss: float
    metrics: dict[str, float]


class EvalLoopOutput(NamedTuple):
    """What the evaluation loop returns: gathered predictions, labels, metrics and sample count."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float]  # the Trainer's evaluation loop always fills both
    num_samples: int


class PredictionOutput(NamedTuple):
    """What `Trainer.predict` returns."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None


class BestRun(NamedTuple):
    """The best trial of a hyperparameter search."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any | None = None


class EvalPrediction:
    """Predictions and labels handed to `compute_metrics`.

    Behaves like the tuple of its non-None fields, so `preds, labels = p` works when `inputs`
    and `losses` were not requested; fields are also available by name.
    """

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None) -> None:
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        self.elements = tuple(
            x for i, x in enumerate((predictions, label_ids, inputs, losses)) if i < 2 or x is not None
        )

    def __iter__(self) -> Iterator[Any]:
        return iter(self.elements)

    def __getitem__(self, idx: int) -> Any:
        return self.elements[idx]

    def __len__(self) -> int:
        return len(self.elements)

    def __repr__(self) -> str:
        names = ("predictions", "label_ids", "inputs", "losses")
        shown = ", ".join(f"{n}={_short(getattr(self, n))}" for n in names if getattr(self, n) is not None)
        return f"EvalPrediction({shown})"


def _short(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return f"<{type(x).__name__} {tuple(shape)}>" if shape is not None else repr(x)


# -- speed metrics and plain-number conversion ---------------------------------------------


def speed_metrics(
    split: str,
    start_time: float,
    num_samples: int | None = None,
    num_steps: int | None = None,
    num_tokens: int | None = None,
) -> dict[str, float]:
    """`{split}_runtime` (4 decimals) and, when the runtime is not 0, per-second rates (3 decimals).

    `start_time` is a `time.time()` reading taken when the measured work began.
    """
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    for name, count in (("samples", num_samples), ("steps", num_steps), ("tokens", num_tokens)):
        if count is not None:
            result[f"{split}_{name}_per_second"] = round(count / runtime, 3)
    return result


@functools.lru_cache(maxsize=64)
def _takes_start_time(function: Callable[..., Any], bound: bool) -> bool:
    try:
        params = list(inspect.signature(function).parameters.values())[int(bound) :]  # after `self`
    except (TypeError, ValueError):  # no signature to read: call it as upstream does
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL or p.name == "start_time" for p in params)


def call_log(log: Callable[..., Any], logs: dict[str, float], start_time: float | None) -> None:
    """`log(logs, start_time)` as transformers >= 4.47 calls a Trainer's `log`, or `log(logs)` for an
    override with the older one-argument signature (`def log(self, logs)`, still common in
    subclasses), which then runs instead of failing on the training rows.
    """
    function = getattr(log, "__func__", None)  # a bound method: its function, cached per override
    takes = _takes_start_time(function, True) if function is not None else _takes_start_time(log, False)
    if takes:
        log(logs, start_time)
    else:
        log(logs)


def denumpify_detensorize(metrics: Any) -> Any:
    """Turn numpy scalars and one-element tensors (also inside lists, tuples, dicts) into Python numbers."""
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(denumpify_detensorize(m) for m in metrics)
    if isinstance(metrics, dict):
        return type(metrics)({k: denumpify_detensorize(v) for k, v in metrics.items()})
    if isinstance(metrics, np.generic):
        return metrics.item()
    if isinstance(metrics, np.ndarray) and metrics.ndim == 0:
        return metrics.item()
    if isinstance(metrics, torch.Tensor) and metrics.numel() == 1:
        return metrics.item()
    return metrics


# -- formatting and files ------------------------------------------------------------------


def _format_duration(seconds: float) -> str:
    """H:MM:SS.cc with hundredths truncated (not rounded), like a stopwatch."""
    sign = "-" if seconds < 0 else ""
    # The tiny epsilon keeps 0.29 s from printing as .28 through binary rounding.
    hundredths = int(math.floor(abs(seconds) * 100 + 1e-6))
    whole, frac = divmod(hundredths, 100)
    return f"{sign}{datetime.timedelta(seconds=whole)}.{frac:02d}"


def metrics_format(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `metrics` made for reading: memory in MB, runtimes as H:MM:SS.cc, FLOPs in GF,
    other floats rounded to 4 decimals."""
    formatted: dict[str, Any] = {}
    for key, value in metrics.items():
        if "_mem_" in key and isinstance(value, (int, float, np.number)):
            formatted[key] = f"{int(value) >> 20}MB"
        elif "_runtime" in key and isinstance(value, (int, float, np.number)):
            formatted[key] = _format_duration(float(value))
        elif key == "total_flos" and isinstance(value, (int, float, np.number)):
            formatted[key] = f"{int(value) >> 30}GF"
        elif isinstance(value, (float, np.floating)):
            formatted[key] = round(float(value), 4)
        else:
            formatted[key] = value
    return formatted


def log_metrics(
    split: str,
    metrics: Mapping[str, Any],
    *,
    is_world_process_zero: bool = True,
    print_fn: Callable[[str], Any] = print,
) -> None:
    """Print `metrics` as an aligned table under `***** {split} metrics *****` (main process only).

    Keys are sorted; the key column is left-aligned and the value column right-aligned.

    Memory keys (`{stage}_mem_{cpu|gpu}_{alloc|peaked}_delta`, in bytes, shown in MB): `alloc` is the
    change in allocated memory over the stage (can be negative), `peaked` the extra memory used at
    the peak above what was left allocated at the end; `alloc + peaked` is what the stage needed.
    GPU figures count only PyTorch's allocator (not the CUDA context); CPU figures are the
    process's resident memory, sampled, so a short peak can be missed.
    """
    if not is_world_process_zero:
        return
    formatted = metrics_format(metrics)
    print_fn(f"***** {split} metrics *****")
    if not formatted:
        return
    key_width = max(len(k) for k in formatted)
    value_width = max(len(str(v)) for v in formatted.values())
    for key in sorted(formatted):
        print_fn(f"  {key:<{key_width}} = {str(formatted[key]):>{value_width}}")


def _check_json_values(metrics: dict[str, Any], split: str) -> None:
    bad = []
    for key, value in metrics.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            bad.append(f"{key} ({type(value).__name__})")
    if bad:
        raise ValueError(
            f"save_metrics({split!r}): values must be JSON numbers/strings; cannot write {', '.join(bad)}"
        )


def save_metrics(
    output_dir: str | os.PathLike,
    split: str,
    metrics: Mapping[str, Any],
    combined: bool = True,
    *,
    is_world_process_zero: bool = True,
) -> None:
    """Write `{output_dir}/{split}_results.json` and, if `combined`, merge into `all_results.json`.

    Numbers are written raw (not formatted); numpy/tensor scalars become plain numbers.
    """
    if not is_world_process_zero:
        return
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    plain = denumpify_detensorize(dict(metrics))
    _check_json_values(plain, split)
    # upstream's bytes: indent 4, no newline at the end
    write_json(os.path.join(output_dir, f"{split}_results.json"), plain, indent=4, end="")
    if combined:
        all_path = os.path.join(output_dir, "all_results.json")
        merged: dict[str, Any] = {}
        if os.path.exists(all_path):
            try:
                merged = read_json_object(all_path)
            except JSONFileError as e:
                raise JSONFileError(f"{e}; cannot merge the {split} metrics into it") from None
        merged.update(plain)
        write_json(all_path, merged, indent=4, end="")


def save_state(
    output_dir: str | os.PathLike, state: TrainerState, *, is_world_process_zero: bool = True
) -> None:
    """Write `{output_dir}/trainer_state.json` (main process only)."""
    if not is_world_process_zero:
        return
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    state.save_to_json(os.path.join(output_dir, "trainer_state.json"))

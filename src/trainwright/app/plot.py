"""`trainwright plot OUTPUT_DIR`: draw a run's log history (logs.jsonl where the JSONL reporter wrote
it, else trainer_state.json, else the newest checkpoint's, for a run that never called save_state)
as PNG files in OUTPUT_DIR, each figure with one title, axis labels and its legend beside the plot.

Figures, each written only when the history has data for it:

``plot_loss.png``           training loss and every eval loss (``eval_loss``, ``eval_<set>_loss``) vs step
``plot_eval_metrics.png``   the other ``eval_*`` metrics, one panel each (timings and memory left out)
``plot_learning_rate.png``  learning rate vs step
``plot_grad_norm.png``      gradient norm vs step
``plot_throughput.png``     ``throughput/*`` rates (SpeedMonitor), with the end-of-run ``train_*_per_second``
                            averages as flat lines over the matching rate; per-device rates only when
                            they differ from the whole-run ones (world size > 1); not drawn (and the
                            log says why) without a SpeedMonitor

matplotlib is an extra (``pip install 'trainwright[plot]'``). Figures are rendered with the Agg
canvas directly, without pyplot, so drawing never changes the caller's matplotlib backend.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from typing import Any, TypeGuard

from trainwright.core.files import read_json_object

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
JSONL_FILE = "logs.jsonl"  # the JSONL reporter's file: every row, a preemption's included
THROUGHPUT_FIGURE = "plot_throughput.png"
# Keys that describe the run (timing, memory, counters) rather than the model's quality.
_RUN_KEY_MARKERS = ("_runtime", "_per_second", "_mem_", "_compilation_time")
# End-of-run averages and the SpeedMonitor rate each one is drawn over (as a flat line).
_RUN_AVERAGES = {
    "train_samples_per_second": "throughput/samples_per_sec",
    "train_steps_per_second": "throughput/batches_per_sec",
    "train_tokens_per_second": "throughput/tokens_per_sec",
}

Series = tuple[list[float], list[float]]  # (steps, values)


def plot_run(output_dir: str) -> list[str]:
    """Draw the figures of the run in `output_dir` into that folder; return the files written."""
    history = load_log_history(output_dir)
    Figure, FigureCanvasAgg = _import_matplotlib()
    figures = _figures(history)
    if history and not any(name == THROUGHPUT_FIGURE for name, _, _ in figures):
        logger.info(
            "%s not drawn: the log history has no throughput/* rows (a SpeedMonitor callback logs them).",
            THROUGHPUT_FIGURE,
        )
    written = []
    for name, title, panels in figures:
        fig = Figure(figsize=(8, 3.2 * len(panels)), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
        for ax, (panel_title, series) in zip(axes, panels):
            _draw_panel(ax, title if len(panels) == 1 else panel_title, panel_title, series)
        if len(panels) > 1:  # one title per figure: a single panel's is the figure's
            fig.suptitle(title)
        path = os.path.join(output_dir, name)
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def _draw_panel(ax: Any, title: str, quantity: str, series: dict[str, Series]) -> None:
    """One panel: its curves against the step, axis labels, and a legend outside the plot area
    (beside it, never over the curves) when there is more than one curve."""
    for label, (steps, values) in series.items():
        ax.plot(steps, values, label=label, marker="o" if len(steps) <= 30 else None, markersize=3)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(quantity)
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small")


def load_log_history(output_dir: str) -> list[dict[str, Any]]:
    """The run's log rows: `output_dir/logs.jsonl` where the JSONL reporter wrote it and it reaches as
    far as the state file (it also holds the row logged at a preemption, after the checkpoint a resume
    continues from), else the `log_history` of `output_dir/trainer_state.json`, or of the newest
    checkpoint's where that reaches further (a run that never called save_state() has only those);
    a clear error when unreadable."""
    jsonl = _jsonl_history(os.path.join(output_dir, JSONL_FILE))
    try:
        state_rows = _state_history(output_dir)
    except FileNotFoundError:
        if not jsonl:
            raise
        state_rows = []
    if jsonl and _last_step(jsonl) >= _last_step(state_rows):
        return jsonl
    return state_rows


def _last_step(rows: list[dict[str, Any]]) -> float:
    return max((r.get("step", 0) for r in rows if _is_number(r.get("step"))), default=0)


def _jsonl_history(path: str) -> list[dict[str, Any]]:
    """The rows of a logs.jsonl file ([] when absent or not one row per line)."""
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    return []  # not the JSONL reporter's file
                if not isinstance(row, dict):
                    return []
                rows.append(row)
    return rows


def _state_history(output_dir: str) -> list[dict[str, Any]]:
    """The `log_history` rows of `output_dir/trainer_state.json`, or of the newest checkpoint's where
    that reaches a later step or the top-level file is absent (`save_model()` alone writes none; each
    checkpoint has its own); a clear error when unreadable."""
    if not os.path.isdir(output_dir):
        raise FileNotFoundError(f"{output_dir} is not a folder.")
    from trainwright.checkpoint import sort_checkpoints

    path = os.path.join(output_dir, STATE_FILE)
    inside = [os.path.join(c, STATE_FILE) for c in sort_checkpoints(output_dir)]
    newest = next((p for p in reversed(inside) if os.path.isfile(p)), None)
    states = {p: read_json_object(p) for p in (path, newest) if p is not None and os.path.isfile(p)}
    if not states:
        raise FileNotFoundError(
            f"{path} does not exist, and no checkpoint of {output_dir} holds one: Trainer.save_state() "
            "writes it, and each checkpoint has its own."
        )
    # the furthest step wins; at the same step the top-level file (it also holds the end-of-run row)
    chosen = max(states, key=lambda p: (_step_of(states[p]), p == path))
    if chosen != path:
        logger.info("Plotting the log history of %s, the newest checkpoint of %s.", chosen, output_dir)
    history = states[chosen].get("log_history")
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        raise ValueError(f"{chosen} has no 'log_history' list of log rows.")
    return history


def _step_of(state: dict[str, Any]) -> float:
    step = state.get("global_step")
    return float(step) if _is_number(step) else 0.0


def _figures(history: list[dict[str, Any]]) -> list[tuple[str, str, list[tuple[str, dict[str, Series]]]]]:
    """(file name, title, panels) of each figure that has data; a panel is (title, {label: series})."""
    keys = sorted({k for row in history for k in row})
    series = {k: s for k in keys if (s := _series(history, k))[0]}

    def panels(names: list[str]) -> list[tuple[str, dict[str, Series]]]:
        return [(n, {n: series[n]}) for n in names]

    loss_keys = [k for k in series if k == "loss" or (k.startswith("eval_") and k.endswith("_loss"))]
    eval_keys = [
        k
        for k in series
        if k.startswith("eval_") and k not in loss_keys and not any(m in k for m in _RUN_KEY_MARKERS)
    ]
    throughput = _throughput_panels(series)
    candidates = [
        ("plot_loss.png", "Loss", [("loss", {k: series[k] for k in loss_keys})] if loss_keys else []),
        ("plot_eval_metrics.png", "Evaluation metrics", panels(eval_keys)),
        ("plot_learning_rate.png", "Learning rate", panels([k for k in ("learning_rate",) if k in series])),
        ("plot_grad_norm.png", "Gradient norm", panels([k for k in ("grad_norm",) if k in series])),
        (THROUGHPUT_FIGURE, "Throughput", throughput),
    ]
    return [c for c in candidates if c[2]]


def _throughput_panels(series: dict[str, Series]) -> list[tuple[str, dict[str, Series]]]:
    """The SpeedMonitor's `throughput/*` rates, whole-run ones first, each end-of-run average drawn as
    a flat line over its rate. A per-device rate is the whole-run rate / world size: drawn only where
    it differs (world size > 1). An average without its rate is left out (a panel of one dot)."""
    rates = sorted((k for k in series if k.startswith("throughput/")), key=lambda k: (k.count("/"), k))
    panels = [(k, {k: series[k]}) for k in rates if not _same_as_whole_run(series, k)]
    for key, over in _RUN_AVERAGES.items():
        target = next((p for title, p in panels if title == over), None)
        if key in series and target is not None and len(series[key][0]) == 1:
            steps = target[over][0]
            target[f"{key} (run average)"] = ([steps[0], steps[-1]], series[key][1] * 2)
    return panels


def _same_as_whole_run(series: dict[str, Series], key: str) -> bool:
    """Whether `throughput/device/<x>` equals `throughput/<x>` at every step (one process)."""
    if not key.startswith("throughput/device/"):
        return False
    whole = series.get("throughput/" + key[len("throughput/device/") :])
    if whole is None:
        return False  # e.g. throughput/device/mfu: per device only
    at_step = dict(zip(*whole))
    return all(
        step in at_step and math.isclose(value, at_step[step], rel_tol=1e-9)
        for step, value in zip(*series[key])
    )


def _series(history: list[dict[str, Any]], key: str) -> Series:
    """Steps and values of `key` over the rows that hold a real number for it (NaN/inf left out)."""
    steps: list[float] = []
    values: list[float] = []
    for row in history:
        value, step = row.get(key), row.get("step")
        if _is_number(value) and _is_number(step) and math.isfinite(value):
            steps.append(float(step))
            values.append(float(value))
    return steps, values


def _is_number(value: Any) -> TypeGuard[numbers.Real]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _import_matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("trainwright plot needs matplotlib: pip install 'trainwright[plot]'") from e
    return Figure, FigureCanvasAgg

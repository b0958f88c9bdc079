"""trainwright's own file reporters: one row per log call in `output_dir/logs.jsonl` or
`output_dir/logs.csv`. They need no package.

Each row has `step` (state.global_step) and `epoch` first, then the logged keys. Resuming keeps
the rows up to the checkpoint's step and drops the later ones (they will be logged again), so a
resumed run's file reads like a run that never stopped; a run starting at step 0 starts a new file.
In a hyperparameter search each trial writes `logs-<trial>.jsonl` / `.csv`.

CSV layout: wide (one column per key). Columns are added as new keys appear (evaluation metrics,
the final summary); the file is then rewritten once with the wider header, atomically, so it is
always a valid CSV that `csv.DictReader` or pandas read directly.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterable
from typing import Any

from trainwright.core.files import atomic_write
from trainwright.reporters.base import Reporter, as_scalar

logger = logging.getLogger(__name__)


def _row_step(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class _RowFileReporter(Reporter):
    """Shared logic: file naming, resume truncation, row building."""

    suffix = ""

    def __init__(self) -> None:
        super().__init__()
        self.path: str | None = None

    def service_address(self) -> str | None:
        return None  # a local file: written on the training thread

    def file_path(self, args: Any, state: Any) -> str:
        """`output_dir/logs.<suffix>`, or `logs-<trial>.<suffix>` in a hyperparameter search."""
        trial = state.trial_name if state.is_hyper_param_search else None
        stem = f"logs-{trial}" if trial else "logs"
        return os.path.join(args.output_dir, f"{stem}.{self.suffix}")

    def on_train_begin(self, args, state, control, **kwargs):
        self.path = self.file_path(args, state)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        if state.global_step == 0:
            if os.path.exists(self.path):
                os.remove(self.path)  # a fresh run starts a new file
        elif os.path.exists(self.path):
            self._keep_rows_up_to(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        if self.path is None:  # evaluate()/predict() without train()
            self.path = self.file_path(args, state)
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        row: dict[str, Any] = {"step": state.global_step, "epoch": state.epoch}
        row.update(logs)
        self._append(row)

    def _keep_rows_up_to(self, step: int) -> None:
        """Drop the rows logged after `step` (the checkpoint being resumed)."""
        raise NotImplementedError

    def _append(self, row: dict[str, Any]) -> None:
        raise NotImplementedError


def _json_value(value: Any) -> Any:
    number = as_scalar(value)
    if number is not None:
        return number
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


class JsonlCallback(_RowFileReporter):
    """Appends one JSON object per log call to `output_dir/logs.jsonl` (NaN/Infinity are written
    as Python's json module does; `json.loads` and pandas read them)."""

    name = "jsonl"
    suffix = "jsonl"

    def _keep_rows_up_to(self, step: int) -> None:
        assert self.path is not None
        kept: list[str] = []
        with open(self.path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row_step = _row_step(json.loads(line).get("step"))
                except (json.JSONDecodeError, AttributeError):
                    logger.warning("%s line %d is not a JSON object (cut off?): dropped", self.path, number)
                    continue
                if row_step is not None and row_step <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
        with atomic_write(self.path) as f:
            f.writelines(kept)

    _file: Any = None

    def _append(self, row: dict[str, Any]) -> None:
        assert self.path is not None
        line = json.dumps({k: _json_value(v) for k, v in row.items()})
        if self._file is None or self._file.name != self.path:
            self._close()
            self._file = open(self.path, "a", encoding="utf-8")  # kept open: one write + flush per row
        self._file.write(line + "\n")
        self._file.flush()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._close()  # the file may be rewritten (resume) or replaced (fresh run)
        super().on_train_begin(args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        self._close()


def _csv_value(value: Any) -> str:
    number = as_scalar(value)
    if number is not None:
        return str(number)
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)


class CsvCallback(_RowFileReporter):
    """Writes `output_dir/logs.csv`, one row per log call, one column per key (see module doc)."""

    name = "csv"
    suffix = "csv"

    def __init__(self) -> None:
        super().__init__()
        self.columns: list[str] = []

    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        assert self.path is not None
        with open(self.path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            return list(reader.fieldnames or []), rows

    def _write(self, columns: list[str], rows: Iterable[dict[str, str]]) -> None:
        assert self.path is not None
        with atomic_write(self.path, newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)

    def _keep_rows_up_to(self, step: int) -> None:
        columns, rows = self._read()
        rows = [r for r in rows if (s := _row_step(r.get("step"))) is not None and s <= step]
        self.columns = columns
        self._write(columns, rows)

    def _append(self, row: dict[str, Any]) -> None:
        assert self.path is not None
        values = {k: _csv_value(v) for k, v in row.items()}
        if not self.columns and os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            self.columns = self._read()[0]  # a file from an earlier evaluate() in this process
        new = [k for k in values if k not in self.columns]
        if new or not os.path.exists(self.path):
            self.columns = self.columns + new
            old_rows = self._read()[1] if os.path.exists(self.path) else []
            self._write(self.columns, [*old_rows, values])
            return
        with open(self.path, "a", encoding="utf-8", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns, restval="").writerow(values)

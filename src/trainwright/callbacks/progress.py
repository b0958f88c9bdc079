"""Console output: ProgressCallback (tqdm bars, or plain lines when not on a terminal) and PrinterCallback."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from tqdm.auto import tqdm

from trainwright.core.events import TrainerCallback
from trainwright.core.state import TrainerControl, TrainerState

# tqdm.auto picks the widget bar inside a Jupyter kernel, whose stderr is not a terminal but
# which still renders bars properly.
_IN_NOTEBOOK = any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__)


_PER_DEVICE = "throughput/device/"


def format_logs(logs: Mapping[str, Any], max_str_len: int | None = None) -> dict[str, Any]:
    """A copy of `logs` for display: no `total_flos`, no per-device rate equal to the whole run's
    (`throughput/device/x` beside the same `throughput/x`: one process), floats to 4 significant
    digits, and strings longer than `max_str_len` replaced by a note giving their length."""
    shown: dict[str, Any] = {}
    for key, value in logs.items():
        whole = "throughput/" + key[len(_PER_DEVICE) :] if key.startswith(_PER_DEVICE) else ""
        if key == "total_flos" or (whole in logs and logs[whole] == value):
            continue
        if isinstance(value, str) and max_str_len is not None and len(value) > max_str_len:
            shown[key] = f"<{len(value)} characters, longer than max_str_len={max_str_len}>"
        elif isinstance(value, float):
            shown[key] = f"{value:.4g}"
        else:
            shown[key] = value
    return shown


def _duration(seconds: float) -> str:
    """`1h02m`, `3m05s`, `12s` (`?` when unknown)."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


PROGRESS_EVERY = "TRAINWRIGHT_PROGRESS_EVERY"


def _interval_from_environment() -> float:
    """Seconds between progress lines from TRAINWRIGHT_PROGRESS_EVERY (30 when unset). A value that
    is no positive number (`abc`, `0`, `-5`, `nan`) is refused: it would print no line, silently."""
    text = os.environ.get(PROGRESS_EVERY)
    if text is None:
        return 30.0
    if text.strip().lower() == "off":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{PROGRESS_EVERY}={text!r} is invalid: it takes the seconds between progress lines off a "
            f"terminal, a number > 0 (e.g. 30, the default; 0.5), or 'off' for no progress lines"
        )
    return value


def _checked_interval(every: Any) -> float:
    """`every` given to the constructor: seconds >= 0 (0: no progress lines)."""
    number = isinstance(every, (int, float)) and not isinstance(every, bool)
    if not (number and math.isfinite(every) and every >= 0):
        raise ValueError(
            f"ProgressCallback: every={every!r} is invalid: seconds between progress lines, a number >= 0 "
            "(0: none)"
        )
    return float(every)


def _has_length(obj: Any) -> bool:
    try:
        return len(obj) is not None
    except TypeError:
        return False


class ProgressCallback(TrainerCallback):
    """Shows training progress on the main process.

    On a terminal: a tqdm bar over `max_steps` (postfix: last loss and learning rate), a second bar
    during evaluation/prediction, and each log row written above the bars. When the output is not
    a terminal (CI logs, nohup, Slurm) no bar is drawn, since every redraw would become a line: each
    log row is printed as one line prefixed with `[step/max_steps]`, one line at the start and end
    of training, and, every `every` seconds, a progress line (step, percent, steps/s, time left).
    Rows logged outside training (a standalone `evaluate()`) are printed too, where transformers
    drops them.

    Args:
        max_str_len: strings in log rows longer than this are replaced by a short note.
        stream: where bars (and, when given, log lines) go; default: bars to stderr, lines to stdout.
        is_tty: force terminal (True) or plain (False) mode; default: bars in a notebook or when
            `stream.isatty()` (stderr's) is true.
        every: seconds between progress lines off a terminal (default: `TRAINWRIGHT_PROGRESS_EVERY`,
            else 30; 0 turns them off). The variable takes a number of seconds > 0, or `off`;
            anything else is refused naming it.
    """

    def __init__(
        self,
        max_str_len: int = 100,
        *,
        stream: IO[str] | None = None,
        is_tty: bool | None = None,
        every: float | None = None,
    ):
        self.max_str_len = max_str_len
        self.stream = stream
        self.is_tty = is_tty
        # off a terminal: a progress line every `every` seconds (TRAINWRIGHT_PROGRESS_EVERY, default 30)
        self.every = _interval_from_environment() if every is None else _checked_interval(every)
        self._next_line = 0.0
        self.training_bar: Any = None
        self.prediction_bar: Any = None
        self.current_step = 0
        self._training = False
        self._start = 0.0
        self._first_step = 0
        self._postfix: dict[str, str] = {}

    # -- helpers ----------------------------------------------------------------------------
    def _use_bars(self) -> bool:
        if self.is_tty is not None:
            return self.is_tty
        if _IN_NOTEBOOK:
            return True
        stream = self.stream if self.stream is not None else sys.stderr
        isatty = getattr(stream, "isatty", None)
        return bool(isatty and isatty())

    def _bar_stream(self) -> IO[str]:
        return self.stream if self.stream is not None else sys.stderr

    def _line_stream(self) -> IO[str]:
        return self.stream if self.stream is not None else sys.stdout

    def _print(self, line: str) -> None:
        stream = self._line_stream()
        stream.write(line + "\n")
        stream.flush()

    # -- events -----------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.current_step = state.global_step
        self._postfix = {}
        if not state.is_world_process_zero:
            return
        self._training = True
        self._start = time.monotonic()
        if self._use_bars():
            self.training_bar = tqdm(
                total=state.max_steps, initial=state.global_step, dynamic_ncols=True, file=self._bar_stream()
            )
        else:
            self._print(f"Training: {state.max_steps} steps (starting at step {state.global_step})")
            self._first_step, self._next_line = state.global_step, self._start + self.every

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.training_bar is not None:
            self.training_bar.update(state.global_step - self.current_step)
        elif self._due(state):
            self._progress_line(state)
        self.current_step = state.global_step

    def _due(self, state: TrainerState) -> bool:
        """A progress line is due off a terminal once `every` seconds passed; none at the last step,
        whose end-of-training line follows at once."""
        if not (self._training and self.every > 0) or state.global_step >= state.max_steps:
            return False
        return time.monotonic() >= self._next_line

    def _progress_line(self, state: TrainerState) -> None:
        """Off a terminal, what the bar would show: step, percent, rate and time left."""
        now = time.monotonic()
        self._next_line = now + self.every
        done, total = state.global_step, max(state.max_steps, 1)
        rate = (done - self._first_step) / max(now - self._start, 1e-9)
        left = (total - done) / rate if rate > 0 else float("inf")
        self._print(
            f"[{done}/{total}] {100 * done / total:.0f}% {rate:.3g} steps/s, about {_duration(left)} left"
        )

    def on_prediction_step(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        eval_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        if not (state.is_world_process_zero and self._use_bars() and _has_length(eval_dataloader)):
            return
        if self.prediction_bar is None:
            self.prediction_bar = tqdm(
                total=len(eval_dataloader),
                leave=self.training_bar is None,
                dynamic_ncols=True,
                file=self._bar_stream(),
            )
        self.prediction_bar.update(1)

    def _close_prediction_bar(self) -> None:
        if self.prediction_bar is not None:
            self.prediction_bar.close()
            self.prediction_bar = None

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._close_prediction_bar()

    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any = None, **kwargs: Any
    ) -> None:
        self._close_prediction_bar()

    def on_log(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping | None = None,
        **kwargs: Any,
    ) -> None:
        if not state.is_world_process_zero or logs is None:
            return
        shown = format_logs(logs, self.max_str_len)
        if self.training_bar is not None:
            for key, label in (("loss", "loss"), ("learning_rate", "lr")):
                if key in shown:
                    self._postfix[label] = str(shown[key])
            if self._postfix:
                self.training_bar.set_postfix(self._postfix, refresh=False)
        if self._training and self.training_bar is None:
            self._print(f"[{state.global_step}/{state.max_steps}] {shown}")
        else:
            # Written above any live bar (tqdm clears and redraws it).
            tqdm.write(str(shown), file=self._line_stream())

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None
        elif self._training:
            elapsed = time.monotonic() - self._start
            self._print(f"Training done: {state.global_step}/{state.max_steps} steps in {elapsed:.1f}s")
        self._training = False


class PrinterCallback(TrainerCallback):
    """Prints each log row on the local main process (no `total_flos`; floats to 4 significant digits)."""

    def on_log(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping | None = None,
        **kwargs: Any,
    ) -> None:
        if state.is_local_process_zero and logs is not None:
            print(format_logs(logs))

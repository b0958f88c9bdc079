"""Result types, metric formatting and files, speed metrics, and evaluation accumulation.

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
from typing import Any, NamedTuple, cast

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


# -- evaluation accumulation ---------------------------------------------------------------
#
# A "nested" value is an array/tensor, None, or a tuple/list/dict of nested values. The helpers
# below walk several nested values of the same structure in step.


def _walk(fn: Callable[[list[Any]], Any], items: list[Any]) -> Any:
    """Apply `fn` to each list of corresponding leaves of `items` and rebuild the structure."""
    first = items[0]
    if isinstance(first, Mapping):
        keys = list(first.keys())
        for it in items[1:]:
            if not isinstance(it, Mapping) or set(it.keys()) != set(keys):
                raise ValueError(f"cannot combine nested values with different keys: {keys} vs {_keys(it)}")
        out = {k: _walk(fn, [it[k] for it in items]) for k in keys}
        return _rebuild_mapping(first, out)
    if isinstance(first, (tuple, list)):
        for it in items[1:]:
            if type(it) is not type(first) or len(it) != len(first):
                raise ValueError(
                    f"cannot combine nested values of different structure: "
                    f"{type(first).__name__}[{len(first)}] vs {type(it).__name__}[{_len(it)}]"
                )
        out_list = [_walk(fn, [it[i] for it in items]) for i in range(len(first))]
        if hasattr(first, "_fields"):  # namedtuple
            return type(first)(*out_list)
        return type(first)(out_list)
    return fn(items)


def _keys(x: Any) -> Any:
    return list(x.keys()) if isinstance(x, Mapping) else type(x).__name__


def _len(x: Any) -> Any:
    return len(x) if hasattr(x, "__len__") else "?"


def _rebuild_mapping(template: Mapping, values: dict) -> Mapping:
    if type(template) is dict:
        return values
    try:
        # a Mapping subclass, tried as a constructor from a dict (a TypeError falls back to the dict)
        return cast(Callable[[dict], Mapping], type(template))(values)
    except TypeError:
        return values


def _concat_leaves(leaves: list[Any], padding_index: int) -> Any:
    if all(x is None for x in leaves):
        return None
    if any(x is None for x in leaves):
        raise ValueError("cannot concatenate: some batches have a value where others have None")
    is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
    if all(is_tensor):
        return _concat_tensors(leaves, padding_index)
    if any(is_tensor):
        raise TypeError("cannot concatenate a mix of torch tensors and numpy arrays; convert them first")
    return _concat_arrays([np.asarray(x) for x in leaves], padding_index)


def _padded_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The output shape if padding is needed, None if a plain concatenation will do."""
    ndims = {len(s) for s in shapes}
    if len(ndims) != 1:
        raise ValueError(f"cannot concatenate arrays with different numbers of dimensions: {sorted(ndims)}")
    tails = {s[1:] for s in shapes}
    if len(tails) == 1:
        return None
    tail = tuple(max(dims) for dims in zip(*tails))
    return (sum(s[0] for s in shapes), *tail)


def _concat_arrays(arrays: list[np.ndarray], padding_index: int) -> np.ndarray:
    arrays = [np.atleast_1d(a) for a in arrays]
    out_shape = _padded_shape([a.shape for a in arrays])
    if out_shape is None:
        return np.concatenate(arrays, axis=0)
    out = np.full(out_shape, padding_index, dtype=np.result_type(*arrays))
    row = 0
    for a in arrays:
        out[(slice(row, row + a.shape[0]), *(slice(0, d) for d in a.shape[1:]))] = a
        row += a.shape[0]
    return out


def _concat_tensors(tensors: list[torch.Tensor], padding_index: int) -> torch.Tensor:
    tensors = [torch.atleast_1d(t) for t in tensors]
    out_shape = _padded_shape([tuple(t.shape) for t in tensors])
    if out_shape is None:
        return torch.cat(tensors, dim=0)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    out = torch.full(out_shape, padding_index, dtype=dtype, device=tensors[0].device)
    row = 0
    for t in tensors:
        out[(slice(row, row + t.shape[0]), *(slice(0, d) for d in t.shape[1:]))] = t
        row += t.shape[0]
    return out


def pad_and_concatenate(arrays: list[Any], padding_index: int = -100) -> Any:
    """Concatenate along dim 0, padding every other dim to the largest size with `padding_index`.

    `arrays` holds numpy arrays or torch tensors (not mixed), or tuples/lists/dicts of them with
    the same structure; the result has that structure. 0-d values count as one sample. The output
    is allocated once, so call this once over a list of chunks rather than once per batch.
    """
    if not isinstance(arrays, (list, tuple)) or len(arrays) == 0:
        raise ValueError("pad_and_concatenate expects a non-empty list of arrays (or nested structures)")
    return _walk(lambda leaves: _concat_leaves(leaves, padding_index), list(arrays))


def _to_numpy_leaf(x: Any) -> Any:
    if x is None or isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):
            # numpy has no bfloat16, and float16 metrics lose too much precision when summed.
            x = x.to(torch.float32)
        return x.numpy()
    return np.asarray(x)


def nested_numpify(x: Any) -> Any:
    """Move tensors (also inside tuples/lists/dicts) to CPU numpy; half floats become float32."""
    return _walk(lambda leaves: _to_numpy_leaf(leaves[0]), [x])


def nested_truncate(x: Any, n: int) -> Any:
    """Keep the first `n` samples of every array (drops samples duplicated to pad the last batch)."""
    return _walk(lambda leaves: None if leaves[0] is None else leaves[0][:n], [x])


class EvalAccumulator:
    """Collects evaluation outputs on the CPU and concatenates them once, at `get_arrays()`.

    Each `add()` moves one chunk (a tensor, an array or a nested structure of them, e.g. the
    predictions of `eval_accumulation_steps` batches already concatenated on the device) to CPU
    numpy and appends it to a list. Nothing is re-concatenated per chunk: repeated concatenation
    copies everything gathered so far at every step, which is what makes RAM and time explode
    on large evaluation sets.

    With `do_concat=False`, `get_arrays()` returns the list of added chunks instead.
    """

    def __init__(self, padding_index: int = -100, do_concat: bool = True) -> None:
        self.padding_index = padding_index
        self.do_concat = do_concat
        self._chunks: list[Any] = []

    def add(self, value: Any) -> None:
        """Move `value` to CPU numpy and keep it; `None` is ignored."""
        if value is None:
            return
        self._chunks.append(nested_numpify(value))

    def __len__(self) -> int:
        return len(self._chunks)

    def get_arrays(self) -> Any:
        """Everything added so far: one padded concatenation (or the list of chunks); None if empty."""
        if not self._chunks:
            return None
        if not self.do_concat:
            return list(self._chunks)
        if len(self._chunks) > 1:
            # Keep the result as the single chunk so a second call (or later adds) reuse it.
            self._chunks = [pad_and_concatenate(self._chunks, self.padding_index)]
        else:
            self._chunks = [_walk(lambda leaves: _atleast_1d(leaves[0]), self._chunks)]
        return self._chunks[0]


def _atleast_1d(x: Any) -> Any:
    return None if x is None else np.atleast_1d(x)

"""Collecting evaluation outputs: streamed to the CPU, put back in dataset order across processes.

Each process keeps its own predictions, labels and per-sample losses as CPU chunks (moved off the
accelerator every `offload_every` batches and concatenated once at the end). With several
processes the per-process results are exchanged once at the end and interleaved back into the
dataset's order (the evaluation sampler deals sample i to data-parallel rank i % ranks, and of the
processes sharing a rank's batch (tensor-parallel peers) the first one's results count; with
`accelerator_config`'s split_batches or dispatch_batches, each process's batch is its slice of a
global batch, put back batch by batch). The samples the sampler repeats to even out the last batch
are cut before the forward (`prediction.py`), so metrics equal one process's. A batch's loss weighs
as its samples; where a collator gives several rows per sample, outputs are put back batch by batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainwright.core.runtime import Runtime
from trainwright.loop.eval.accumulate import EvalAccumulator


@dataclass
class EvalResult:
    predictions: Any
    label_ids: Any
    inputs: Any
    losses: np.ndarray | None
    loss: float | None
    num_samples: int


class EvalGatherer:
    """Accumulates one evaluation's outputs; see the module docstring."""

    def __init__(
        self,
        runtime: Runtime,
        offload_every: int = 1,
        keep_outputs: bool = True,
        do_concat: bool = True,
        by_batch: bool = False,
    ):
        self.runtime = runtime
        # each process's batch k is the k-th slice of global batch k (split/dispatch_batches)
        self.by_batch = by_batch
        self._rows: list[int] = []  # rows of each batch's outputs
        self._batch_samples: list[int] = []  # samples of each batch (its loss's weight)
        self.offload_every = max(int(offload_every), 1)
        self.keep_outputs = keep_outputs
        self._acc = {
            name: EvalAccumulator(padding_index=-100, do_concat=do_concat)
            for name in ("preds", "labels", "inputs")
        }
        self._losses = EvalAccumulator(padding_index=-100, do_concat=True)
        self._pending: list[tuple[str, Any]] = []
        self._batches = 0
        self._samples = 0
        self.row_per_sample = True  # every batch had as many rows as samples (outputs are per sample)

    def add(
        self, *, loss, samples: int, rows: int | None = None, predictions=None, labels=None, inputs=None
    ) -> None:
        """One batch's results: its loss weighs as its `samples`; its outputs have `rows` rows (more
        than its samples where the collator gives several rows per sample)."""
        rows = samples if rows is None else rows
        self._samples += samples
        self._rows.append(rows)
        self._batch_samples.append(samples)
        self.row_per_sample = self.row_per_sample and rows == samples
        if loss is not None:
            self._pending.append(("loss", loss.detach().float().reshape(1).repeat(samples)))
        if self.keep_outputs:
            for name, value in (("preds", predictions), ("labels", labels), ("inputs", inputs)):
                if value is not None:
                    self._pending.append((name, value))
        self._batches += 1
        if self._batches % self.offload_every == 0:
            self._flush()

    def _flush(self) -> None:
        for name, value in self._pending:
            (self._losses if name == "loss" else self._acc[name]).add(value)
        self._pending.clear()

    def _per_data_rank(self, gathered: list[Any]) -> list[Any]:
        """One entry per data-parallel rank: processes that shared a batch (tensor-parallel peers)
        computed the same outputs, so the first of each is kept."""
        layout = getattr(self.runtime, "layout", None)
        return gathered if layout is None else [gathered[r] for r in layout.data_leaders]

    def _merge(self, local: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Every process's results in dataset order, and the samples seen. Per-sample losses are dealt
        back sample by sample; outputs of several rows per sample batch by batch (their rows cannot be
        dealt back one by one), as are all results of whole-batch dealing."""
        gather = self.runtime.all_gather_object
        parts = self._per_data_rank(gather(local))
        rows = self._per_data_rank(gather(self._rows))
        samples = self._per_data_rank(gather(self._batch_samples))
        per_sample = all(gather(self.row_per_sample))
        merged: dict[str, Any] = {}
        for key in local:
            values = [p[key] for p in parts]
            if key == "losses":
                merged[key] = in_batch_order(values, samples) if self.by_batch else interleave_shards(values)
            elif per_sample and not self.by_batch:
                merged[key] = interleave_shards(values)
            elif self._acc["preds"].do_concat:
                merged[key] = in_batch_order(values, rows)
            else:
                merged[key] = _chunks_in_batch_order(values)
        return merged, sum(self._per_data_rank(gather(self._samples)))

    def finish(self) -> EvalResult:
        """Concatenate once and put the processes' results in dataset order. Nothing is trimmed: the
        evaluation loop cut the sampler's repeats before the forward, so every sample added is real
        (a sampler may also deal a sample more than once on purpose, as TRL's GRPO repeats prompts)."""
        self._flush()
        local = {name: acc.get_arrays() for name, acc in self._acc.items()}
        local["losses"] = self._losses.get_arrays()
        if self.runtime.distributed:
            merged, n = self._merge(local)
        else:
            merged, n = local, self._samples
        losses = merged["losses"]
        loss = None
        if losses is not None and len(losses):
            finite = losses[np.isfinite(losses)]
            loss = float(finite.mean()) if finite.size else float("nan")
        return EvalResult(merged["preds"], merged["labels"], merged["inputs"], losses, loss, n)


def interleave_shards(per_rank: list[Any]) -> Any:
    """Dataset order from per-process results (arrays, or nested tuples/lists/dicts of them):
    row q of process r goes to position q * W + r, the evaluation sampler's dealing order.
    Sequence dimensions are padded with -100 to the longest process's."""
    first = per_rank[0]
    if first is None:
        return None
    if isinstance(first, (list, tuple)):
        return type(first)(interleave_shards([p[i] for p in per_rank]) for i in range(len(first)))
    if isinstance(first, Mapping):
        return {k: interleave_shards([p[k] for p in per_rank]) for k in first}
    arrays = [np.asarray(a) for a in per_rank]
    trailing = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
    arrays = [_pad_trailing(a, trailing) for a in arrays]
    world = len(arrays)
    rows = sum(a.shape[0] for a in arrays)
    out = np.empty((rows, *trailing), dtype=np.result_type(*arrays))
    for r, a in enumerate(arrays):
        out[r::world][: a.shape[0]] = a
    return out


def in_batch_order(per_rank: list[Any], rows: list[list[int]]) -> Any:
    """Dataset order from per-process results whose batch k holds `rows[r][k]` samples of global
    batch k (process 0's slice first): global batch by global batch, process by process."""
    first = per_rank[0]
    if first is None:
        return None
    if isinstance(first, (list, tuple)):
        return type(first)(in_batch_order([p[i] for p in per_rank], rows) for i in range(len(first)))
    if isinstance(first, Mapping):
        return {k: in_batch_order([p[k] for p in per_rank], rows) for k in first}
    arrays = [np.asarray(a) for a in per_rank]
    trailing = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
    arrays = [_pad_trailing(a, trailing) for a in arrays]
    starts = [np.concatenate([[0], np.cumsum(r)]).astype(int) for r in rows]
    pieces = [
        arrays[r][starts[r][k] : starts[r][k + 1]]
        for k in range(max(len(r) for r in rows))
        for r in range(len(arrays))
        if k < len(rows[r])
    ]
    return np.concatenate(pieces) if pieces else arrays[0][:0]


def _chunks_in_batch_order(per_rank: list[Any]) -> Any:
    """eval_do_concat_batches=False: the per-batch chunks, global batch by global batch."""
    if per_rank[0] is None:
        return None
    return [p[k] for k in range(max(len(p) for p in per_rank)) for p in per_rank if k < len(p)]


def _pad_trailing(a: np.ndarray, trailing: tuple[int, ...], value: int = -100) -> np.ndarray:
    if a.shape[1:] == trailing:
        return a
    out = np.full((a.shape[0], *trailing), value, dtype=a.dtype)
    out[(slice(None), *(slice(0, s) for s in a.shape[1:]))] = a
    return out

"""Which samples of an evaluation batch are real: `real_batches` cuts a loader's batches to them.

The evaluation sampler repeats samples to even out processes; those are cut before the forward, so
they weigh in neither the loss nor the metrics. A batch's samples are what the sampler put in it,
not its rows: a collator may give several rows per sample (preference pairs), and such a batch is
collated again from its real samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from trainwright import data as data_utils
from trainwright.core.nested import same_mapping
from trainwright.data import packing
from trainwright.data.look_ahead import fetched_ahead
from trainwright.modeling.loss import batch_size


def real_batches(
    dataloader: Any, should_stop: Callable[[int], None] | None, collective: bool
) -> Iterator[tuple[int, Any, int, int]]:
    """(index, batch, rows, samples) of the loader, cut to its real samples; fetched one ahead, as
    accelerate's loader fetches them in transformers' evaluation (`look_ahead.fetched_ahead`). A batch
    of only repeats is dropped, unless every process must run the forward (`collective`: a sharded
    model), where it comes with 0 samples. `should_stop(index)` is called before each batch (it
    raises to stop)."""
    counter = _SampleCounter(dataloader)
    for index, inputs in enumerate(fetched_ahead(dataloader)):
        if should_stop is not None:
            should_stop(index)
        rows = batch_size(inputs)
        first, samples, keep = counter.count(rows, getattr(dataloader, "real_rows_in_batch", None))
        if keep < samples:
            if keep == 0 and not collective:
                continue
            if keep:
                inputs, rows = _first_samples(dataloader, inputs, rows, samples, first, keep)
        yield index, inputs, rows if keep else 0, keep


class _SampleCounter:
    """Samples per evaluation batch: from the sampler's geometry when trainwright's sampler cuts the
    batches (each holds `batch_size` samples but the last), else the batch's rows; and how many of
    them are real (not the sampler's repeats)."""

    def __init__(self, dataloader: Any) -> None:
        self.geometry = data_utils.sampler_geometry(dataloader)
        self.real = rows_to_keep(dataloader)
        self.dealt = 0

    def count(self, rows: int, real_in_batch: int | None) -> tuple[int, int, int]:
        """(position of this batch's first sample, samples in it, real ones among them)."""
        geometry, first = self.geometry, self.dealt
        samples = min(geometry[0], geometry[1] - first) if geometry else rows
        if real_in_batch is not None:  # a dispatched last batch says it itself
            self.real = first + real_in_batch
        self.dealt += samples
        if self.real is None or self.dealt <= self.real:
            return first, samples, samples
        return first, samples, max(self.real - first, 0)


def _first_samples(
    dataloader: Any, inputs: Any, rows: int, samples: int, first: int, keep: int
) -> tuple[Any, int]:
    """The batch of its first `keep` samples, and its rows: its first rows where a sample is a row;
    else (a collator giving several rows per sample) those samples collated again, from the
    sampler's order, since which rows belong to a sample is the collator's layout."""
    if rows == samples:
        return take_rows(inputs, keep), keep
    sampler: Any = getattr(dataloader, "sampler", None)
    if not callable(getattr(sampler, "rank_order", None)):
        raise ValueError(
            f"Evaluation: a batch of {samples} samples came as {rows} rows, {samples - keep} of its samples "
            "repeated to even out processes, and its loader cannot give its samples again to leave those "
            "out. Evaluate with accelerator_config={'even_batches': False} (no repeats)."
        )
    indices = sampler.rank_order()[first : first + keep]
    batch = dataloader.collate_fn([dataloader.dataset[i] for i in indices])
    return batch, batch_size(batch)


def rows_to_keep(dataloader: Any) -> int | None:
    """How many of this process's evaluation rows are real samples (None when none are padding)."""
    sampler: Any = getattr(dataloader, "sampler", None)
    if not getattr(sampler, "num_padding", 0):
        return None
    return int(sampler.num_real)


def deals_whole_batches(dataloader: Any) -> bool:
    """Whether each process's batch is a contiguous slice of a global batch (accelerator_config's
    split_batches or dispatch_batches) rather than every N-th sample: results are then put back
    in order batch by batch."""
    sampler: Any = getattr(dataloader, "sampler", None)
    dataset: Any = getattr(dataloader, "dataset", None)
    return bool(
        getattr(dataloader, "deals_whole_batches", False)
        or getattr(dataset, "deals_whole_batches", False)
        or getattr(sampler, "block", 1) > 1
    )


def take_rows(inputs: Any, keep: int) -> Any:
    """The first `keep` samples of a batch (tensors with a batch dimension are sliced; a padding-free
    row is cut after its `keep`-th sample)."""
    if isinstance(inputs, Mapping) and (packed := packing.take_samples(inputs, keep)) is not None:
        return same_mapping(inputs, packed)
    if isinstance(inputs, Mapping):
        return same_mapping(inputs, {k: take_rows(v, keep) for k, v in inputs.items()})
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(take_rows(v, keep) for v in inputs)
    if isinstance(inputs, torch.Tensor) and inputs.dim() > 0:
        return inputs[:keep]
    return inputs

"""Counting what a data loader holds: samples per batch from the sampler's geometry, samples in a data
loader. (Label targets, `count_items`, are counted next to the loss: `modeling/loss.py`.)"""

from __future__ import annotations

from typing import Any

from trainwright.data.kinds import has_length


def sampler_geometry(dataloader: Any) -> tuple[int, int] | None:
    """(batch size, this process's samples per epoch) when the loader cuts its batches in order
    from a resumable sampler, so that each batch's number of samples is known without reading
    it (a packed batch's tensors do not show it); None for any other loader."""
    sampler: Any = getattr(dataloader, "sampler", None)
    size = getattr(dataloader, "batch_size", None)
    if not hasattr(sampler, "set_start") or not isinstance(size, int) or size < 1:
        return None
    return size, len(sampler)


def num_examples(dataloader: Any) -> int:
    """Samples in the dataloader's dataset, else batches x batch size."""
    dataset = getattr(dataloader, "dataset", None)
    if dataset is not None and has_length(dataset):
        return len(dataset)
    batch_size = getattr(dataloader, "batch_size", None)
    if batch_size and has_length(dataloader):
        return len(dataloader) * batch_size
    raise ValueError(
        f"num_examples: neither the dataset ({type(dataset).__name__}) nor the dataloader has a length."
    )

"""Counting what a batch holds: label targets (`count_items`, shifted for causal LMs), samples per
batch from the sampler's geometry, samples in a data loader."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainwright.data.columns import unwrap_model
from trainwright.data.kinds import IGNORE_INDEX, has_length


def count_items(
    inputs: Mapping[str, Any], *, shift: bool, label_name: str = "labels", ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Label targets the loss averages over, as a tensor on the labels' device (no host sync).

    ``shift=True`` for a causal LM: it predicts token ``t+1`` from position ``t``, so the first
    label of each sequence is never a target.
    """
    labels = inputs.get(label_name) if isinstance(inputs, Mapping) else None
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"count_items: the batch has no tensor {label_name!r} (keys: {list(inputs)}).")
    if shift:
        labels = labels[..., 1:]
    return (labels != ignore_index).sum()


_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def is_causal_lm(model: Any) -> bool:
    """Whether the model's labels are shifted inside its loss (next-token prediction).

    A custom module states it with the attribute ``label_shift = True`` (trainwright's contract;
    ``False`` overrides the guesses below). Otherwise: a transformers class named
    ``*ForCausalLM`` / ``*LMHeadModel``, a ``loss_type`` of "ForCausalLM", or a config that is a
    decoder without being encoder-decoder.
    """
    model = unwrap_model(model)
    declared = getattr(model, "label_shift", None)
    if declared is not None:
        return bool(declared)
    if type(model).__name__.endswith(_CAUSAL_SUFFIXES):
        return True
    config = getattr(model, "config", None)
    if (
        getattr(model, "loss_type", None) == "ForCausalLM"
        or getattr(config, "loss_type", None) == "ForCausalLM"
    ):
        return True
    return bool(getattr(config, "is_decoder", False)) and not bool(
        getattr(config, "is_encoder_decoder", False)
    )


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

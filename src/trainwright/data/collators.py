"""Collators: stack features into tensors (`default_data_collator`), pad with a tokenizer
(`PaddingCollator`) or without one (`pad_sequence_collator`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from trainwright.data.kinds import IGNORE_INDEX, LABEL_KEYS


def _as_mapping(feature: Any) -> Mapping[str, Any]:
    if isinstance(feature, Mapping):
        return feature
    if hasattr(feature, "__dict__"):
        return vars(feature)
    raise TypeError(
        f"default_data_collator: a feature must be a mapping or an object, got {type(feature).__name__}."
    )


def _is_integer(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex())
    if isinstance(value, np.ndarray):
        return np.issubdtype(value.dtype, np.integer) or value.dtype == np.bool_
    if isinstance(value, (list, tuple)):
        return _is_integer(value[0]) if value else True
    return isinstance(value, (int, np.integer, bool))


def _to_tensor(key: str, values: list[Any], dtype: torch.dtype | None = None) -> torch.Tensor:
    first = values[0]
    try:
        if isinstance(first, torch.Tensor):
            out = torch.stack(values)
        elif isinstance(first, np.ndarray):
            out = torch.from_numpy(np.stack(values))
        else:
            out = torch.tensor(values)
    except (ValueError, RuntimeError) as err:
        raise ValueError(
            f"default_data_collator: feature {key!r} cannot be stacked ({err}); sequences of different "
            "lengths need PaddingCollator or pad_sequence_collator."
        ) from err
    return out.to(dtype) if dtype is not None else out


def default_data_collator(features: Sequence[Any], return_tensors: str = "pt") -> dict[str, Any]:
    """Stack a list of dicts (or objects with attributes) into a dict of tensors.

    ``label`` or ``label_ids`` becomes ``labels``, int64 for integer labels and float32 for float
    labels (floating tensors keep their dtype). Keys whose first value is None or a string are
    dropped: they cannot become a tensor. ``return_tensors="np"`` gives numpy arrays instead.
    """
    if return_tensors not in ("pt", "np"):
        raise ValueError(
            f"default_data_collator: return_tensors must be 'pt' or 'np', got {return_tensors!r}."
        )
    if not features:
        raise ValueError("default_data_collator: got an empty batch.")
    first = features[0]
    if (
        return_tensors == "pt"
        and type(first) is dict
        and first.keys().isdisjoint(LABEL_KEYS)
        and all(isinstance(v, torch.Tensor) for v in first.values())
    ):  # dicts of tensors, the common case: stack each key (what the general path does, minus its checks)
        try:
            return {k: torch.stack([f[k] for f in features]) for k in first}
        except (RuntimeError, KeyError, TypeError):
            pass  # the general path gives the clear error
    rows = [_as_mapping(f) for f in features]
    first = rows[0]
    batch: dict[str, Any] = {}
    label_key = next((k for k in LABEL_KEYS if first.get(k) is not None), None)
    if label_key is not None:
        values = [row[label_key] for row in rows]
        integer = _is_integer(values[0])
        floating_tensor = isinstance(values[0], torch.Tensor) and not integer
        dtype = torch.long if integer else None if floating_tensor else torch.float32
        batch["labels"] = _to_tensor("labels", values, dtype)
    for key, value in first.items():
        if key in LABEL_KEYS or value is None or isinstance(value, str):
            continue
        batch[key] = _to_tensor(key, [row[key] for row in rows])
    if return_tensors == "np":
        batch = {k: v.numpy() for k, v in batch.items()}
    return batch


class PaddingCollator:
    """Pads a batch with the tokenizer's (or processor's tokenizer's) ``pad`` method.

    ``label``/``label_ids`` are renamed ``labels``. Variable-length label sequences are not
    padded by ``pad``; use :func:`pad_sequence_collator` for those.
    """

    def __init__(
        self,
        processing_class: Any,
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str = "pt",
    ) -> None:
        owner = processing_class
        if not callable(getattr(owner, "pad", None)):
            owner = getattr(processing_class, "tokenizer", None)
        if not callable(getattr(owner, "pad", None)):
            raise TypeError(
                f"PaddingCollator needs a tokenizer (or processor) with a pad() method, got "
                f"{type(processing_class).__name__}."
            )
        self.tokenizer = owner
        self.padding = padding
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self.return_tensors = return_tensors

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, Any]:
        batch = self.tokenizer.pad(
            features,
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
            return_tensors=self.return_tensors,
        )
        batch = dict(batch)
        for key in LABEL_KEYS:
            if key in batch:
                batch["labels"] = batch.pop(key)
        return batch


def _pad(values: list[Any], pad_value: int) -> torch.Tensor:
    seqs = [torch.as_tensor(v) for v in values]
    longest = max(int(s.shape[0]) for s in seqs)
    out = torch.full((len(seqs), longest, *seqs[0].shape[1:]), pad_value, dtype=seqs[0].dtype)
    for row, seq in enumerate(seqs):
        out[row, : seq.shape[0]] = seq
    return out


def _pad_sequences(features: Sequence[Mapping[str, Any]], pad_token_id: int, label_pad_token_id: int) -> dict:
    rows = [_as_mapping(f) for f in features]
    pads = {"input_ids": pad_token_id, "attention_mask": 0, "labels": label_pad_token_id}
    # only sequences are padded: a scalar label (classification) is stacked like any other key
    pads = {k: v for k, v in pads.items() if k in rows[0] and torch.as_tensor(rows[0][k]).dim() > 0}
    batch = {key: _pad([r[key] for r in rows], value) for key, value in pads.items()}
    if "input_ids" in batch and "attention_mask" not in batch:
        mask = torch.zeros(batch["input_ids"].shape[:2], dtype=torch.long)
        for row, r in enumerate(rows):
            mask[row, : len(r["input_ids"])] = 1
        batch["attention_mask"] = mask
    rest = [{k: v for k, v in r.items() if k not in pads} for r in rows]
    if rest[0]:
        batch.update(default_data_collator(rest))
    return batch


def pad_sequence_collator(
    pad_token_id: int = 0, label_pad_token_id: int = IGNORE_INDEX
) -> Callable[[Sequence[Mapping[str, Any]]], dict[str, torch.Tensor]]:
    """A collator that right-pads ``input_ids`` (with ``pad_token_id``), ``attention_mask`` (0,
    built from the lengths when absent) and ``labels`` (``label_pad_token_id``); other keys are
    stacked by :func:`default_data_collator`. Picklable, so it works with spawned workers."""
    return partial(_pad_sequences, pad_token_id=pad_token_id, label_pad_token_id=label_pad_token_id)

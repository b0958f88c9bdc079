"""The one walk over nested values (tensors inside mappings, lists and tuples), for every layer.

A mapping keeps its type (`BatchEncoding`, `UserDict`, ...; a dict where the type cannot be built
from one), a tuple or list keeps its type, named tuples included; other values are leaves.
`map_tensors` is the single-structure walk the step path uses (a batch to the device); `zip_map`
walks several values of one structure in step (evaluation chunks concatenated, batches joined).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def same_mapping(original: Mapping, items: dict) -> Mapping:
    """`items` as the mapping type of `original` (BatchEncoding, UserDict, ...), else a dict."""
    mapping_type: Any = type(original)
    if mapping_type is dict:
        return items
    try:  # a Mapping subclass, tried as a constructor from a dict
        return mapping_type(items)
    except (TypeError, ValueError):
        return items


def same_sequence(original: list | tuple, items: list) -> Any:
    """`items` as the sequence type of `original` (a named tuple takes them as fields)."""
    if hasattr(original, "_fields"):
        return type(original)(*items)
    return type(original)(items)


def map_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """`data` with `fn` applied to every tensor in it; other leaves are kept."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return same_mapping(data, {k: map_tensors(fn, v) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return same_sequence(data, [map_tensors(fn, v) for v in data])
    return data


def zip_map(fn: Callable[[list[Any]], Any], items: list[Any]) -> Any:
    """`fn` applied to each list of corresponding leaves of `items` (values of one structure), the
    structure rebuilt as the first's; values whose keys or lengths differ are refused."""
    first = items[0]
    if isinstance(first, Mapping):
        keys = list(first.keys())
        for it in items[1:]:
            if not isinstance(it, Mapping) or set(it.keys()) != set(keys):
                found = list(it.keys()) if isinstance(it, Mapping) else type(it).__name__
                raise ValueError(f"cannot combine nested values with different keys: {keys} vs {found}")
        return same_mapping(first, {k: zip_map(fn, [it[k] for it in items]) for k in keys})
    if isinstance(first, (tuple, list)):
        for it in items[1:]:
            if type(it) is not type(first) or len(it) != len(first):
                size = len(it) if hasattr(it, "__len__") else "?"
                raise ValueError(
                    f"cannot combine nested values of different structure: "
                    f"{type(first).__name__}[{len(first)}] vs {type(it).__name__}[{size}]"
                )
        return same_sequence(first, [zip_map(fn, [it[i] for it in items]) for i in range(len(first))])
    return fn(items)


def holds_tensors(data: Any) -> bool:
    """Whether `data` is a tensor or a non-empty mapping / list / tuple whose leaves are all tensors."""
    if isinstance(data, torch.Tensor):
        return True
    values = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else None
    return bool(values) and all(holds_tensors(v) for v in values)  # type: ignore[union-attr]


def to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """`data` on `device`: every tensor in it moved."""
    return map_tensors(lambda t: t.to(device, non_blocking=non_blocking), data)


def detach(data: Any) -> Any:
    """`data` with every tensor detached."""
    return map_tensors(torch.Tensor.detach, data)


def slice_batch(batch: Any, rows: slice) -> Any:
    """`rows` of every tensor in the batch (as accelerate's `slice_tensors`: a 0-d tensor is kept)."""
    return map_tensors(lambda t: t[rows] if t.dim() else t, batch)


def concat_batches(first: Any, second: Any) -> Any:
    """Two batches of one structure, one after the other (tensors concatenated on dim 0; a 0-d
    tensor or another leaf: the first's)."""

    def join(pair: list[Any]) -> Any:
        a, b = pair
        return torch.cat([a, b]) if isinstance(a, torch.Tensor) and a.dim() else a

    return zip_map(join, [first, second])

"""What kind of data a dataset is (sized, iterable, a `datasets.Dataset`) and the label names and
ignore index that the samplers, collators and item counting share."""

from __future__ import annotations

import sys
from typing import Any

from torch.utils.data import IterableDataset

IGNORE_INDEX = -100
LABEL_KEYS = ("label", "label_ids")


def has_length(obj: Any) -> bool:
    """Whether ``len(obj)`` works (an IterableDataset without ``__len__`` raises TypeError)."""
    try:
        return len(obj) is not None
    except (TypeError, NotImplementedError):
        return False


def is_hf_map_dataset(obj: Any) -> bool:
    module = sys.modules.get("datasets")
    return module is not None and isinstance(obj, module.Dataset)


def fingerprint(dataset: Any) -> str | None:
    """A `datasets` dataset's fingerprint (a hash of its source and the operations that made it), else
    None. Only for a dataset that has one: two with the same length and other rows differ in it."""
    value = getattr(dataset, "_fingerprint", None) if is_hf_map_dataset(dataset) else None
    return value if isinstance(value, str) else None


def is_iterable_dataset(dataset: Any) -> bool:
    """True for datasets a sampler cannot index: torch/datasets IterableDatasets or no ``__len__``."""
    module = sys.modules.get("datasets")
    if isinstance(dataset, IterableDataset):
        return True
    if module is not None and isinstance(dataset, module.IterableDataset):
        return True
    return not has_length(dataset)

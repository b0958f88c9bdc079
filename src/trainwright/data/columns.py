"""Column removal: the batch keys a model's forward takes, and dropping the others from a
`datasets.Dataset` up front or from each batch (`RemoveColumnsCollator`)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainwright.core.modules import without_peft
from trainwright.data.kinds import LABEL_KEYS, is_hf_map_dataset

logger = logging.getLogger(__name__)


def forward_arg_names(model: Any, label_names: Iterable[str] = ()) -> set[str]:
    """Named parameters of ``model.forward`` plus "label", "label_ids" and ``label_names``:
    the batch keys the model can be given."""
    params = inspect.signature(without_peft(model).forward).parameters.values()
    named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return named | set(LABEL_KEYS) | set(label_names)


class RemoveColumnsCollator:
    """Drops batch keys the model does not accept, then calls ``collate_fn``.

    For data that is not a ``datasets.Dataset`` (whose columns :func:`remove_unused_columns`
    removes up front). Logs the dropped keys once.
    """

    def __init__(
        self, collate_fn: Callable[[list[Any]], Any], keep: set[str], description: str | None = None
    ) -> None:
        self.collate_fn = collate_fn
        self.keep = set(keep)
        self.description = description
        self._logged = False

    def _drop(self, feature: Any) -> Any:
        if not isinstance(feature, Mapping):
            return feature
        if not self._logged:
            self._logged = True
            ignored = sorted(set(feature) - self.keep)
            if ignored:
                where = f" of the {self.description} set" if self.description else ""
                logger.info(
                    "Ignoring columns%s that the model's forward does not take: %s.",
                    where,
                    ", ".join(ignored),
                )
        return {k: v for k, v in feature.items() if k in self.keep}

    def __call__(self, features: list[Any]) -> Any:
        first = features[0] if features else None
        if isinstance(first, Mapping) and self.keep.issuperset(first):
            return self.collate_fn(features)  # nothing to drop (the common case): no copies
        return self.collate_fn([self._drop(f) for f in features])


def remove_unused_columns(dataset: Any, keep: set[str], description: str | None = None) -> Any:
    """A ``datasets.Dataset`` without the columns the model does not take; other data unchanged."""
    if not is_hf_map_dataset(dataset):
        return dataset
    columns = list(dataset.column_names)
    ignored = [c for c in columns if c not in keep]
    if len(ignored) == len(columns):
        raise ValueError(
            f"No column of the {description + ' ' if description else ''}dataset {columns} is an argument of the model's forward "
            f"({sorted(keep)}): nothing would be left to train on. Rename the columns or set "
            "remove_unused_columns=False."
        )
    if ignored:
        logger.info("Removing dataset columns the model's forward does not take: %s.", ", ".join(ignored))
        dataset = dataset.remove_columns(ignored)
    return dataset

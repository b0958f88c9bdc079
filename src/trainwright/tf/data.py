"""`tf.data` plumbing of TFTrainer: splitting elements into features and labels, the per-epoch
training order (seeded, so a resumed run sees the same batches), and slicing a step's batch into
replicas and accumulation micro-batches inside the compiled step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

LABEL_KEYS = ("labels", "label", "label_ids")


def known_length(dataset: tf.data.Dataset, what: str) -> int:
    """The number of elements of `dataset`; a clear error when TensorFlow cannot tell."""
    n = int(dataset.cardinality().numpy())
    if n == tf.data.INFINITE_CARDINALITY:
        raise ValueError(f"{what} is infinite (repeat() without a count): give a finite dataset")
    if n == tf.data.UNKNOWN_CARDINALITY:
        raise ValueError(
            f"{what} has an unknown length (e.g. after filter()): assert it with "
            "dataset.apply(tf.data.experimental.assert_cardinality(N))"
        )
    return n


def split_element(element: Any, label_names: Sequence[str] | None) -> tuple[Any, Any]:
    """(features, labels) of one batch: `(features, labels)` tuples, `(features,)`, or a dict whose
    labels sit under `label_names` (default: the first of labels/label/label_ids present)."""
    if isinstance(element, tuple):
        if len(element) == 2:
            return element[0], element[1]
        if len(element) == 1:
            return element[0], None
        raise ValueError(
            f"dataset elements must be (features, labels) or (features,); got {len(element)} parts"
        )
    if isinstance(element, Mapping):
        names = list(label_names) if label_names else [k for k in LABEL_KEYS if k in element][:1]
        missing = [n for n in names if n not in element]
        if missing:
            raise ValueError(
                f"label_names {missing} are not keys of the dataset's elements {sorted(element)}"
            )
        features = {k: v for k, v in element.items() if k not in names}
        if not names:
            return features, None
        labels = element[names[0]] if len(names) == 1 else {n: element[n] for n in names}
        return features, labels
    return element, None


def epoch_order(
    dataset: tf.data.Dataset, length: int, seed: int, epoch: int, step_batch: int, drop_last: bool, skip: int
) -> tf.data.Dataset:
    """The batches of one training epoch: a full shuffle seeded by (seed, epoch), batched by one
    optimizer step's samples over all replicas, the first `skip` batches left out (resume)."""
    ds = dataset.shuffle(length, seed=seed + epoch, reshuffle_each_iteration=False)
    ds = ds.batch(step_batch, drop_remainder=drop_last)
    if skip:
        ds = ds.skip(skip)
    return ds.prefetch(tf.data.AUTOTUNE)


def rows(batch: Any) -> tf.Tensor:
    """Number of rows (samples) of a batch: the first dimension of its first tensor."""
    first = tf.nest.flatten(batch)[0]
    return tf.shape(first)[0]


def take_rows(batch: Any, start: Any, stop: Any) -> Any:
    """Rows [start, stop) of every tensor in the batch."""
    if batch is None:
        return None
    return tf.nest.map_structure(lambda t: t[start:stop], batch)


def part(batch_rows: Any, index: Any, parts: int) -> tuple[Any, Any]:
    """Row range of part `index` of `parts` near-equal parts (sizes differ by at most one)."""
    return (index * batch_rows) // parts, ((index + 1) * batch_rows) // parts

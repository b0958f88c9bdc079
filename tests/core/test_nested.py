"""core/nested.py: the one walk over nested values, on what users' collators give (a tokenizer's
`BatchEncoding`, named tuples of model outputs), not only on dicts."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from transformers import BatchEncoding

from trainwright.core.nested import (
    concat_batches,
    detach,
    holds_tensors,
    map_tensors,
    slice_batch,
    to_device,
    zip_map,
)

Pair = namedtuple("Pair", ["logits", "labels"])


def _batch(rows: int) -> BatchEncoding:
    return BatchEncoding(
        {"input_ids": torch.arange(rows * 3).reshape(rows, 3), "labels": [torch.ones(rows)], "name": "x"}
    )


def test_map_tensors_keeps_batch_encoding_lists_and_named_tuples():
    out = map_tensors(lambda t: t * 2, _batch(2))
    assert isinstance(out, BatchEncoding) and out["name"] == "x" and isinstance(out["labels"], list)
    assert out["input_ids"].tolist() == [[0, 2, 4], [6, 8, 10]]
    pair = map_tensors(lambda t: t + 1, Pair(torch.zeros(2), (torch.zeros(1),)))
    assert type(pair) is Pair and pair.logits.tolist() == [1.0, 1.0] and pair.labels[0].tolist() == [1.0]


def test_to_device_detach_and_slice_keep_the_structure():
    grad = torch.ones(3, requires_grad=True) * 2
    assert not detach({"a": [grad]})["a"][0].requires_grad
    moved = to_device(_batch(2), torch.device("cpu"))
    assert isinstance(moved, BatchEncoding)
    cut = slice_batch({"x": torch.arange(4), "scalar": torch.tensor(3.0)}, slice(1, 3))
    assert cut["x"].tolist() == [1, 2] and cut["scalar"].item() == 3.0


def test_concat_batches_joins_rows_and_keeps_other_leaves():
    joined = concat_batches(_batch(2), _batch(1))
    assert isinstance(joined, BatchEncoding) and joined["input_ids"].shape == (3, 3)
    assert joined["labels"][0].shape == (3,) and joined["name"] == "x"
    with pytest.raises(ValueError, match="different keys"):
        concat_batches({"a": torch.ones(1)}, {"b": torch.ones(1)})


def test_zip_map_refuses_values_of_another_structure():
    assert zip_map(sum, [Pair(1, 2), Pair(3, 4)]) == Pair(4, 6)
    with pytest.raises(ValueError, match=r"tuple\[2\] vs list\[2\]"):
        zip_map(sum, [(1, 2), [3, 4]])


def test_holds_tensors():
    assert holds_tensors(_batch(1).data | {"name": torch.ones(1)}) and holds_tensors(torch.ones(1))
    assert not holds_tensors(_batch(1)) and not holds_tensors({}) and not holds_tensors([])

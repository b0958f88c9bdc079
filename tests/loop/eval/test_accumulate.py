"""accumulate.py: evaluation outputs padded, concatenated once, numpified and truncated."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

from trainwright.loop.eval import accumulate as A
from trainwright.loop.eval.accumulate import (
    EvalAccumulator,
    nested_numpify,
    nested_truncate,
    pad_and_concatenate,
)

# -- padding and concatenation -------------------------------------------------------------


def test_pad_and_concatenate_variable_lengths_numpy():
    a = np.arange(6).reshape(2, 3)
    b = np.arange(10).reshape(2, 5) + 100
    c = np.ones((1, 2), dtype=np.int64)
    out = pad_and_concatenate([a, b, c])
    assert out.shape == (5, 5)
    np.testing.assert_array_equal(out[:2, :3], a)
    assert (out[:2, 3:] == -100).all()
    np.testing.assert_array_equal(out[2:4], b)
    np.testing.assert_array_equal(out[4], [1, 1, -100, -100, -100])


def test_pad_and_concatenate_pads_every_trailing_dim_and_promotes_dtype():
    a = np.zeros((1, 2, 4), dtype=np.float32)
    b = np.ones((2, 3, 1), dtype=np.float64)
    out = pad_and_concatenate([a, b], padding_index=-1)
    assert out.shape == (3, 3, 4) and out.dtype == np.float64
    assert (out[0, :2, :] == 0).all() and (out[0, 2, :] == -1).all()
    assert (out[1:, :, 0] == 1).all() and (out[1:, :, 1:] == -1).all()


def test_pad_and_concatenate_torch_keeps_tensors():
    a = torch.zeros(2, 3)
    b = torch.ones(1, 4)
    out = pad_and_concatenate([a, b])
    assert isinstance(out, torch.Tensor) and out.shape == (3, 4)
    assert out[0, 3] == -100 and out[2, 3] == 1
    same = pad_and_concatenate([torch.zeros(2, 3), torch.ones(1, 3)])
    assert same.shape == (3, 3) and same[2].sum() == 3
    scalars = pad_and_concatenate([torch.tensor(1.0), torch.tensor(2.0)])
    assert scalars.tolist() == [1.0, 2.0]


def test_pad_and_concatenate_nested_structures():
    Out = namedtuple("Out", "logits hidden")
    batches = [
        Out(np.zeros((2, 3)), {"h": np.zeros((2, 1)), "extra": None}),
        Out(np.ones((1, 5)), {"extra": None, "h": np.ones((1, 1))}),
    ]
    out = pad_and_concatenate(batches)
    assert isinstance(out, Out)
    assert out.logits.shape == (3, 5) and out.logits[0, 4] == -100 and out.logits[2, 4] == 1
    assert out.hidden["h"].shape == (3, 1) and out.hidden["extra"] is None
    lists = pad_and_concatenate([[np.zeros(2), np.zeros((2, 2))], [np.ones(1), np.ones((1, 3))]])
    assert isinstance(lists, list) and lists[0].shape == (3,) and lists[1].shape == (3, 3)


@pytest.mark.parametrize(
    "batches, error",
    [
        ([], "non-empty list"),
        ([(np.zeros(1),), (np.zeros(1), np.zeros(1))], "different structure"),
        ([{"a": np.zeros(1)}, {"b": np.zeros(1)}], "different keys"),
        ([np.zeros((1, 2)), np.zeros(3)], "numbers of dimensions"),
        ([np.zeros(1), None], "None"),
        ([np.zeros(1), torch.zeros(1)], "mix of torch tensors and numpy"),
    ],
)
def test_pad_and_concatenate_errors(batches, error):
    with pytest.raises((ValueError, TypeError), match=error):
        pad_and_concatenate(batches)


def test_nested_numpify_and_truncate():
    x = {"a": torch.ones(4, 2, dtype=torch.bfloat16), "b": (torch.zeros(4, dtype=torch.float16), None)}
    out = nested_numpify(x)
    assert out["a"].dtype == np.float32 and out["b"][0].dtype == np.float32 and out["b"][1] is None
    cut = nested_truncate(out, 3)
    assert cut["a"].shape == (3, 2) and cut["b"][0].shape == (3,) and cut["b"][1] is None
    assert nested_truncate(torch.arange(5), 2).tolist() == [0, 1]


# -- accumulator ---------------------------------------------------------------------------


def test_eval_accumulator_variable_lengths_and_nested():
    acc = EvalAccumulator()
    assert acc.get_arrays() is None
    acc.add(None)
    acc.add((torch.zeros(2, 3, dtype=torch.bfloat16), torch.tensor([1, 2])))
    acc.add((torch.ones(3, 6, requires_grad=True), torch.tensor([3, 4, 5])))
    assert len(acc) == 2
    logits, labels = acc.get_arrays()
    assert isinstance(logits, np.ndarray) and logits.shape == (5, 6) and logits.dtype == np.float32
    assert (logits[:2, 3:] == -100).all() and (logits[2:] == 1).all()
    assert labels.tolist() == [1, 2, 3, 4, 5]
    # Adding after reading keeps everything.
    acc.add((torch.full((1, 2), 7.0), torch.tensor([6])))
    logits, labels = acc.get_arrays()
    assert logits.shape == (6, 6) and labels.tolist() == [1, 2, 3, 4, 5, 6]
    assert logits[5, 0] == 7 and logits[5, 2] == -100


def test_eval_accumulator_single_scalar_chunk_and_no_concat():
    acc = EvalAccumulator()
    acc.add(torch.tensor(0.5))
    assert acc.get_arrays().tolist() == [0.5]
    listed = EvalAccumulator(do_concat=False)
    listed.add(torch.zeros(2, 3))
    listed.add(torch.zeros(1, 4))
    chunks = listed.get_arrays()
    assert [c.shape for c in chunks] == [(2, 3), (1, 4)]
    assert all(isinstance(c, np.ndarray) for c in chunks)


def test_eval_accumulator_concatenates_once(monkeypatch):
    calls = {"concatenate": 0, "pad": 0}
    real_concatenate = np.concatenate
    real_pad = A.pad_and_concatenate

    def counting_concatenate(*a, **k):
        calls["concatenate"] += 1
        return real_concatenate(*a, **k)

    def counting_pad(*a, **k):
        calls["pad"] += 1
        return real_pad(*a, **k)

    monkeypatch.setattr(A.np, "concatenate", counting_concatenate)
    monkeypatch.setattr(A, "pad_and_concatenate", counting_pad)

    acc = EvalAccumulator()
    for _ in range(20):
        acc.add(torch.ones(4, 3))
    assert calls == {"concatenate": 0, "pad": 0}  # add() only moves and stores
    out = acc.get_arrays()
    assert out.shape == (80, 3)
    assert calls == {"concatenate": 1, "pad": 1}
    acc.get_arrays()
    assert calls == {"concatenate": 1, "pad": 1}  # cached, not redone

    var = EvalAccumulator()
    for n in range(1, 11):
        var.add(torch.ones(2, n))
    assert var.get_arrays().shape == (20, 10)
    assert calls == {"concatenate": 1, "pad": 2}  # one padded pass, no concatenate at all

"""Evaluation outputs collected on the CPU: `EvalAccumulator` and the padded concatenation it
runs once, at the end (a "nested" value is an array/tensor, None, or a tuple/list/dict of nested
values; `core/nested.zip_map` walks several of one structure in step)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainwright.core.nested import zip_map


def _concat_leaves(leaves: list[Any], padding_index: int) -> Any:
    if all(x is None for x in leaves):
        return None
    if any(x is None for x in leaves):
        raise ValueError("cannot concatenate: some batches have a value where others have None")
    is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
    if all(is_tensor):
        return _concat_tensors(leaves, padding_index)
    if any(is_tensor):
        raise TypeError("cannot concatenate a mix of torch tensors and numpy arrays; convert them first")
    return _concat_arrays([np.asarray(x) for x in leaves], padding_index)


def _padded_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The output shape if padding is needed, None if a plain concatenation will do."""
    ndims = {len(s) for s in shapes}
    if len(ndims) != 1:
        raise ValueError(f"cannot concatenate arrays with different numbers of dimensions: {sorted(ndims)}")
    tails = {s[1:] for s in shapes}
    if len(tails) == 1:
        return None
    tail = tuple(max(dims) for dims in zip(*tails))
    return (sum(s[0] for s in shapes), *tail)


def _concat_arrays(arrays: list[np.ndarray], padding_index: int) -> np.ndarray:
    arrays = [np.atleast_1d(a) for a in arrays]
    out_shape = _padded_shape([a.shape for a in arrays])
    if out_shape is None:
        return np.concatenate(arrays, axis=0)
    out = np.full(out_shape, padding_index, dtype=np.result_type(*arrays))
    row = 0
    for a in arrays:
        out[(slice(row, row + a.shape[0]), *(slice(0, d) for d in a.shape[1:]))] = a
        row += a.shape[0]
    return out


def _concat_tensors(tensors: list[torch.Tensor], padding_index: int) -> torch.Tensor:
    tensors = [torch.atleast_1d(t) for t in tensors]
    out_shape = _padded_shape([tuple(t.shape) for t in tensors])
    if out_shape is None:
        return torch.cat(tensors, dim=0)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    out = torch.full(out_shape, padding_index, dtype=dtype, device=tensors[0].device)
    row = 0
    for t in tensors:
        out[(slice(row, row + t.shape[0]), *(slice(0, d) for d in t.shape[1:]))] = t
        row += t.shape[0]
    return out


def pad_and_concatenate(arrays: list[Any], padding_index: int = -100) -> Any:
    """Concatenate along dim 0, padding every other dim to the largest size with `padding_index`.

    `arrays` holds numpy arrays or torch tensors (not mixed), or tuples/lists/dicts of them with
    the same structure; the result has that structure. 0-d values count as one sample. The output
    is allocated once, so call this once over a list of chunks rather than once per batch.
    """
    if not isinstance(arrays, (list, tuple)) or len(arrays) == 0:
        raise ValueError("pad_and_concatenate expects a non-empty list of arrays (or nested structures)")
    return zip_map(lambda leaves: _concat_leaves(leaves, padding_index), list(arrays))


def _to_numpy_leaf(x: Any) -> Any:
    if x is None or isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):
            # numpy has no bfloat16, and float16 metrics lose too much precision when summed.
            x = x.to(torch.float32)
        return x.numpy()
    return np.asarray(x)


def nested_numpify(x: Any) -> Any:
    """Move tensors (also inside tuples/lists/dicts) to CPU numpy; half floats become float32."""
    return zip_map(lambda leaves: _to_numpy_leaf(leaves[0]), [x])


def nested_truncate(x: Any, n: int) -> Any:
    """Keep the first `n` samples of every array (drops samples duplicated to pad the last batch)."""
    return zip_map(lambda leaves: None if leaves[0] is None else leaves[0][:n], [x])


class EvalAccumulator:
    """Collects evaluation outputs on the CPU and concatenates them once, at `get_arrays()`.

    Each `add()` moves one chunk (a tensor, an array or a nested structure of them, e.g. the
    predictions of `eval_accumulation_steps` batches already concatenated on the device) to CPU
    numpy and appends it to a list. Nothing is re-concatenated per chunk: repeated concatenation
    copies everything gathered so far at every step, which is what makes RAM and time explode
    on large evaluation sets.

    With `do_concat=False`, `get_arrays()` returns the list of added chunks instead.
    """

    def __init__(self, padding_index: int = -100, do_concat: bool = True) -> None:
        self.padding_index = padding_index
        self.do_concat = do_concat
        self._chunks: list[Any] = []

    def add(self, value: Any) -> None:
        """Move `value` to CPU numpy and keep it; `None` is ignored."""
        if value is None:
            return
        self._chunks.append(nested_numpify(value))

    def __len__(self) -> int:
        return len(self._chunks)

    def get_arrays(self) -> Any:
        """Everything added so far: one padded concatenation (or the list of chunks); None if empty."""
        if not self._chunks:
            return None
        if not self.do_concat:
            return list(self._chunks)
        if len(self._chunks) > 1:
            # Keep the result as the single chunk so a second call (or later adds) reuse it.
            self._chunks = [pad_and_concatenate(self._chunks, self.padding_index)]
        else:
            self._chunks = [zip_map(lambda leaves: _atleast_1d(leaves[0]), self._chunks)]
        return self._chunks[0]


def _atleast_1d(x: Any) -> Any:
    return None if x is None else np.atleast_1d(x)

"""Helpers shared by the observe tests."""

from __future__ import annotations

import mmap

import numpy as np


def touched_buffer(nbytes: int) -> np.ndarray:
    """`nbytes` of fresh resident pages, unmapped when the array goes.

    An anonymous mapping, not malloc: after a long test session the heap holds resident free chunks,
    and malloc reuses them for a request this size, so RSS (what the memory tracker reads) does not move.
    """
    buf = np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)
    buf.fill(1)  # every page becomes resident
    return buf

"""Sizes written for people: `parse_size("5GB") -> 5_000_000_000` (checkpoint shards, argument checks)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)


def parse_size(size: int | str) -> int:
    """Bytes in `size`: an int, or a string like "5GB" (10**9), "500MB", "2GiB" (2**30)."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif isinstance(size, str) and (m := _SIZE_RE.match(size)):
        value = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
    else:
        raise ValueError(
            f"max_shard_size must be a positive int or a string like '5GB' or '500MB', got {size!r}"
        )
    if value <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return value
